package finality_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitingChain answers every deposit "mined, not final yet".
type waitingChain struct{}

func (waitingChain) CheckDeposit(context.Context, chain.Deposit, chain.Policy) (chain.Verdict, error) {
	return chain.Verdict{State: chain.Wait, ReceiptSeen: true, BlockNumber: 7, BlockHash: "0xb7", Reason: "block 7 not final"}, nil
}

func (waitingChain) StillCanonical(context.Context, chain.Deposit, uint64, string) (chain.Canonicity, error) {
	return chain.Canonicity{State: chain.Canonical}, nil
}

type noAlerts struct{}

func (noAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// TestScheduleFollowsTheDatabaseClock: a worker whose clock is hours off
// neither moves next_check_at nor decides the finality timeout early.
func TestScheduleFollowsTheDatabaseClock(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)

	const first = 5 * time.Second
	for i, skew := range []time.Duration{-6 * time.Hour, 6 * time.Hour} {
		id := "skew" + skew.String()
		txHash := fmt.Sprintf("0x%064x", i+1)
		e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
			TxHash: txHash, TraceID: "trace-" + id}
		inserted, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
		claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, 1)

		gate := finality.New(finality.Options{
			Store: db, Chain: waitingChain{}, Assets: assets, Policy: chain.FinalizedPolicy(),
			Timeout: time.Hour, RecheckFirst: first, RecheckMax: time.Minute,
			Alerts: noAlerts{}, Log: zerolog.Nop(),
			Now: func() time.Time { return time.Now().Add(skew) },
		})
		credit, err := gate.Check(ctx, postgres.LedgerItem{Event: claimed[0].Event})
		require.NoError(t, err)
		require.Nil(t, credit)

		var status string
		var aheadMillis int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT status, (extract(epoch FROM next_check_at - now()) * 1000)::bigint
			FROM payment_events WHERE event_id = $1`, id).Scan(&status, &aheadMillis))
		require.Equal(t, string(payment.StatusAwaitingFinality), status, "skew %s: a fresh deposit is not timed out", skew)
		require.Greater(t, aheadMillis, int64(0), "skew %s", skew)
		require.LessOrEqual(t, aheadMillis, first.Milliseconds(), "skew %s: next_check_at is the database's now() + %s", skew, first)
	}
}
