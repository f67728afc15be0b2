package invariant_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func settle(t *testing.T, db *postgres.DB, id string, typ payment.EventType, amount string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: typ, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString(amount)}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{})
	require.NoError(t, err)
}

func failing(r invariant.Report) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Violations > 0 {
			out = append(out, f.Invariant)
		}
	}
	for _, c := range r.Conservation {
		if !c.Holds() {
			out = append(out, "conservation "+c.Asset)
		}
	}
	return out
}

func TestInvariantsHoldThenCatchTampering(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("10")))
	settle(t, db, "d1", payment.Deposit, "5")
	settle(t, db, "w1", payment.Withdrawal, "3")
	settle(t, db, "w2", payment.Withdrawal, "100") // insufficient funds: a business outcome

	report, err := invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.True(t, report.OK(), report.String())

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)

	// A balance changed by hand.
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = balance + 1 WHERE user_id = 1 AND asset = 'ETH'`)
	require.NoError(t, err)
	report, err = invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.False(t, report.OK())
	require.ElementsMatch(t, []string{"balance = initial_balance + SUM(journal)", "conservation ETH"}, failing(report))
	require.Contains(t, report.String(), "user 1 ETH: balance 13")
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = balance - 1 WHERE user_id = 1 AND asset = 'ETH'`)
	require.NoError(t, err)

	// A dead-lettered event without its DLQ row, and one left pending.
	_, err = conn.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash)
		VALUES ('x', 'deposit', 1, 'ETH', 1, decode(repeat('00', 32), 'hex'))`)
	require.NoError(t, err)
	report, err = invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.Equal(t, []string{"every accepted event is terminal"}, failing(report))
	live, err := invariant.Check(ctx, db, invariant.Options{})
	require.NoError(t, err)
	require.True(t, live.OK(), "a live system may have events in flight")
	_, err = conn.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'dead_lettered' WHERE event_id = 'x'`)
	require.NoError(t, err)
	report, err = invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.Equal(t, []string{"failed events have a DLQ row or a business outcome"}, failing(report))
}
