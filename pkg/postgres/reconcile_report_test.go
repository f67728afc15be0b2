package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestReportedLaterCarriesItsOwnSample: a pass's mismatches reported in
// two goes each come with a sample of their own; the second report
// showed the first chunk's, already reported, instead of the new one.
func TestReportedLaterCarriesItsOwnSample(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for u := int64(1); u <= 3; u++ {
		_, err := db.CreateUser(ctx, u)
		require.NoError(t, err)
		require.NoError(t, db.SetInitialBalance(ctx, u, "ETH", decimal.RequireFromString("1")))
	}
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 2 WHERE user_id IN (1, 3)`)
	require.NoError(t, err)
	report := func() []postgres.UnreportedMismatches {
		t.Helper()
		var got []postgres.UnreportedMismatches
		require.NoError(t, db.ReportMismatches(ctx, func(u []postgres.UnreportedMismatches) { got = u }))
		return got
	}

	// One chunk of one balance: user 1's mismatch, reported.
	pass, err := db.ReconcileFull(ctx, time.Hour, 1, 1)
	require.NoError(t, err)
	require.False(t, pass.Finished)
	got := report()
	require.Len(t, got, 1)
	require.EqualValues(t, 1, got[0].Mismatches)
	require.Contains(t, got[0].Sample, "user 1 ETH")

	// The rest of the pass (settlectl's, say): user 3's.
	pass, err = db.ReconcileFull(ctx, time.Hour, 1, 10)
	require.NoError(t, err)
	require.True(t, pass.Finished)
	got = report()
	require.Len(t, got, 1)
	require.EqualValues(t, 1, got[0].Mismatches)
	require.Contains(t, got[0].Sample, "user 3 ETH")
	require.NotContains(t, got[0].Sample, "user 1 ETH", "already reported")

	require.Empty(t, report())
}
