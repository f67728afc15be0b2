package finality_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestGateWithoutAnyRPC: a worker with no RPC at all (ETH_MAINNET enabled
// under none) still gates: a deposit with a transaction on ETH_MAINNET
// passes unchecked, and one on a network taken out of NETWORKS while it
// waited (BASE_MAINNET) waits for an operator, never credited unasked,
// and an alert calls one.
func TestGateWithoutAnyRPC(t *testing.T) {
	env := config.FromMap(map[string]string{"NETWORKS": "ETH_MAINNET", "DEPOSIT_FINALITY": "finalized", "DEPOSIT_FINALITY_ETH_MAINNET": "none"})
	s := finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
	require.False(t, s.HasRPC())

	ctx := context.Background()
	db := testenv.OpenDB(t, testenv.DatabaseURL(t))
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)
	raised := &alerts{}
	gate := finality.NewOnClients(s, finality.Deps{Store: db, Assets: assets, Alerts: raised, Log: zerolog.Nop()}, nil)

	for i, network := range []string{"ETH_MAINNET", "BASE_MAINNET"} {
		e := payment.Event{ID: "dep-" + network, Type: payment.Deposit, UserID: 1, Asset: "USDC", Amount: decimal.RequireFromString("1000"),
			TxHash: fmt.Sprintf("0x%064x", 0xdead+i), Network: network, TraceID: "t-" + network}
		inserted, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
		claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		credit, err := gate.Check(ctx, postgres.LedgerItem{Event: claimed[0].Event})
		require.NoError(t, err)
		if network == "ETH_MAINNET" {
			require.NotNil(t, credit, "policy none without an RPC: credited unchecked")
			require.Empty(t, raised.raised())
			continue
		}
		require.Nil(t, credit, "not enabled here: it waits")
		v, err := db.Event(ctx, e.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusAwaitingFinality, v.Status, "it waits")
		require.Contains(t, v.Error, "has no RPC in this worker")
		require.Equal(t, []string{"network_not_enabled:BASE_MAINNET"}, raised.raised(), "nothing ends this wait but an operator")
	}
}
