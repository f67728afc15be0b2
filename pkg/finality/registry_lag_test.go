package finality_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// creditingChain answers every deposit "final".
type creditingChain struct{ waitingChain }

func (creditingChain) CheckDeposit(context.Context, chain.Deposit, chain.Policy) (chain.Verdict, error) {
	return chain.Verdict{State: chain.Credit, Finalized: true, BlockNumber: 9, BlockHash: "0xb9"}, nil
}

// A deposit of an asset listed after this worker last read the registry
// waits for the worker's next refresh instead of dead-lettering, and is
// credited once the registry has it.
func TestDepositOfAnAssetNewerThanTheRegistryWaits(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	stale, err := db.Assets(ctx)
	require.NoError(t, err)
	_, err = db.AddAsset(ctx, payment.Asset{Code: "NEWT", Network: payment.DefaultNetwork, Contract: "0x5fbdb2315678afecb367f032d93f642f64180aa3", Decimals: 6})
	require.NoError(t, err)

	e := payment.Event{ID: "newt-1", Type: payment.Deposit, UserID: 1, Asset: "NEWT", Amount: decimal.RequireFromString("5.25"),
		TxHash: fmt.Sprintf("0x%064x", 1), TraceID: "trace-newt-1"}
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	gate := finality.New(finality.Options{
		Store: db, Chain: creditingChain{}, Assets: stale, Policy: chain.FinalizedPolicy(),
		Timeout: time.Hour, RecheckFirst: time.Second, RecheckMax: time.Minute, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	item := postgres.LedgerItem{Event: claimed[0].Event}
	credit, err := gate.Check(ctx, item)
	require.NoError(t, err, "not a dead letter")
	require.Nil(t, credit)
	view, err := db.Event(ctx, "newt-1")
	require.NoError(t, err)
	require.Equal(t, payment.StatusAwaitingFinality, view.Status)

	fresh, err := db.Assets(ctx)
	require.NoError(t, err)
	stale.Replace(fresh) // what KeepRegistry does every REGISTRY_REFRESH
	credit, err = gate.Check(ctx, item)
	require.NoError(t, err)
	require.NotNil(t, credit, "credited once the registry has the listing")

	// Past FINALITY_TIMEOUT an unlisted asset is refused as before.
	late := finality.New(finality.Options{
		Store: db, Chain: creditingChain{}, Assets: payment.NewRegistry(nil), Policy: chain.FinalizedPolicy(),
		Timeout: time.Nanosecond, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	_, err = late.Check(ctx, item)
	require.ErrorIs(t, err, payment.ErrInvalid)
}
