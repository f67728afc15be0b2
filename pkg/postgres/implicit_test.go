package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/postgres"
)

// TestBatchIsOneTransaction: ingest and the outbox claim send no BEGIN or
// COMMIT; they rely on a batch's statements running in one implicit
// transaction that commits at its Sync, on the hot path's settings
// lasting to its end and no further, and on a failed commit reaching
// Close (here a deferred unique check, which only the commit runs).
func TestBatchIsOneTransaction(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.sql.Exec(ctx, `CREATE TABLE implicit_probe (k int, CONSTRAINT implicit_probe_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)

	b := &pgx.Batch{}
	b.Queue(postgres.QueryText("hot_path_plans"))
	b.Queue(`INSERT INTO implicit_probe VALUES (1)`)
	b.Queue(`SELECT current_setting('enable_seqscan')`)
	b.Queue(`INSERT INTO implicit_probe VALUES (1)`)
	br := f.sql.SendBatch(ctx, b)
	_, err = br.Exec()
	require.NoError(t, err)
	_, err = br.Exec()
	require.NoError(t, err)
	var seqscan string
	require.NoError(t, br.QueryRow().Scan(&seqscan))
	require.Equal(t, "off", seqscan, "the plan settings did not reach the batch's later statements")
	_, err = br.Exec()
	require.NoError(t, err, "the unique check is deferred to the commit")
	err = br.Close()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the failed commit did not reach Close: %v", err)
	require.Equal(t, "23505", pgErr.Code)

	var rows int
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT count(*) FROM implicit_probe`).Scan(&rows))
	require.Zero(t, rows, "the first insert outlived the failed commit")
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT current_setting('enable_seqscan')`).Scan(&seqscan))
	require.Equal(t, "on", seqscan, "the plan settings outlived the batch")

	// And a batch that succeeds has committed by its Close: another
	// connection sees its row.
	b = &pgx.Batch{}
	b.Queue(postgres.QueryText("hot_path_plans"))
	b.Queue(`INSERT INTO implicit_probe VALUES (2)`)
	require.NoError(t, f.sql.SendBatch(ctx, b).Close())
	other, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer other.Close(ctx)
	require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM implicit_probe WHERE k = 2`).Scan(&rows))
	require.Equal(t, 1, rows)
}
