package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestLedgerOnASchemaBehindIsUnavailable: the ledger run against a
// database that lacks a table or column it uses (migrations not applied
// yet) fails as unavailable, which the worker retries without spending
// the event's budget, never as an internal error that dead-letters it.
// Once the schema is back the same event applies.
func TestLedgerOnASchemaBehindIsUnavailable(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{
		ID: "behind-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"), TraceID: "t-behind-1",
	}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	item := []postgres.LedgerItem{{Event: claimed[0].Event}}

	for _, c := range []struct{ name, hide, restore string }{
		{"undefined column", `ALTER TABLE balances RENAME COLUMN held TO held_later`, `ALTER TABLE balances RENAME COLUMN held_later TO held`},
		{"undefined table", `ALTER TABLE balances RENAME TO balances_later`, `ALTER TABLE balances_later RENAME TO balances`},
	} {
		_, err = conn.Exec(ctx, c.hide)
		require.NoError(t, err)
		_, err = db.ApplyBatch(ctx, item, postgres.LedgerOptions{})
		require.Error(t, err, c.name)
		require.True(t, errors.Is(err, payment.ErrUnavailable), "%s: %v", c.name, err)
		require.True(t, postgres.SchemaMismatch(err), "%s: %v", c.name, err)
		_, err = conn.Exec(ctx, c.restore)
		require.NoError(t, err)
	}

	results, err := db.ApplyBatch(ctx, item, postgres.LedgerOptions{})
	require.NoError(t, err)
	require.Equal(t, postgres.Applied, results[0].Kind)
	require.Equal(t, payment.StatusConfirmed, results[0].Status)
}
