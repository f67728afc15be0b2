package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestTraceparentMigration: 0014 adds payment_events.traceparent without
// rewriting the table (its file stays the same), rows stored before it
// read NULL, and the format CHECK holds for what is written after it.
func TestTraceparentMigration(t *testing.T) {
	ctx := context.Background()
	db, conn := migratedTo(t, 13)
	_, err := conn.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, trace_id)
		VALUES ('before-0014', 'deposit', 1, 'ETH', 1, sha256('x'), 'order-42')`)
	require.NoError(t, err)
	relfilenode := func() uint32 {
		var n uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT relfilenode FROM pg_class WHERE relname = 'payment_events'`).Scan(&n))
		return n
	}
	before := relfilenode()

	applied, err := db.MigrateTo(ctx, 14)
	require.NoError(t, err)
	require.Equal(t, []string{"0014_traceparent.sql"}, applied)
	require.Equal(t, before, relfilenode(), "0014 rewrote payment_events")
	var traceID string
	var traceparent *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT trace_id, traceparent FROM payment_events WHERE event_id = 'before-0014'`).Scan(&traceID, &traceparent))
	require.Equal(t, "order-42", traceID, "an old trace id of any shape stays")
	require.Nil(t, traceparent)

	for _, bad := range []string{"garbage", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"} {
		_, err = conn.Exec(ctx, `UPDATE payment_events SET traceparent = $1 WHERE event_id = 'before-0014'`, bad)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%q: %v", bad, err)
		require.Equal(t, "23514", pgErr.Code, bad)
	}
	_, err = conn.Exec(ctx, `UPDATE payment_events SET traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' WHERE event_id = 'before-0014'`)
	require.NoError(t, err)
}

// migratedTo is a fresh database migrated up to version, with user 1, and
// a connection of its own to it.
func migratedTo(t *testing.T, version int) (*postgres.DB, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, version)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `INSERT INTO users (id) VALUES (1)`)
	require.NoError(t, err)
	return db, conn
}
