package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestCleanupRunsPastFailedPartitionMaintenance: a partition maintenance
// that fails (here a day ahead overlapped by a partition of other bounds)
// fails the run, but the old notifications and transfer reports are still
// deleted. The job returned on that error first, and a failure repeated
// every night let both tables grow without bound (found by an audit).
func TestCleanupRunsPastFailedPartitionMaintenance(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	var day string
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'processed_events_p' || to_char(now() AT TIME ZONE 'UTC' + interval '5 days', 'YYYYMMDD')`).Scan(&day))
	_, err = conn.Exec(ctx, `DROP TABLE `+pgx.Identifier{day}.Sanitize())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE processed_events_odd PARTITION OF processed_events
		FOR VALUES FROM ((date_trunc('day', now() AT TIME ZONE 'UTC') + interval '5 days 12 hours') AT TIME ZONE 'UTC')
		             TO ((date_trunc('day', now() AT TIME ZONE 'UTC') + interval '6 days') AT TIME ZONE 'UTC')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, created_at)
		VALUES ('old-delivered', 'e1', 1, 'deposit_credited', '{}', 'delivered', now() - interval '30 days')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO transfer_reports (event_id, reporter, first_at) VALUES ('e1', 'alchemy', now() - interval '30 days')`)
	require.NoError(t, err)

	alerts := alert.New(zerolog.New(io.Discard), alert.Options{})
	t.Cleanup(alerts.Close)
	job := cleanup(db, alerts, zerolog.New(io.Discard), prometheus.NewRegistry(),
		cleanupSettings{Retention: postgres.CleanupRetentionDefault, PartitionLockTimeout: 100 * time.Millisecond})
	err = job(ctx)
	require.ErrorContains(t, err, "would overlap", "the failed day is the run's error")
	count := func(query string) int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, query).Scan(&n))
		return n
	}
	require.Zero(t, count(`SELECT count(*) FROM notification_outbox`), "old notifications deleted all the same")
	require.Zero(t, count(`SELECT count(*) FROM transfer_reports`), "old transfer reports deleted all the same")
}

// TestCleanupGoesOnPastStuckBatch: a batch stuck behind a lock (here
// SHARE on transfer_reports, as a CREATE INDEX takes) ends at
// CLEANUP_BATCH_TIMEOUT and fails the run, and the other tables' old rows
// are deleted all the same, in batches, counted as they go. One delete
// waited for the lock until the job's hour was spent, and the tables
// after it were not cleaned that night.
func TestCleanupGoesOnPastStuckBatch(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, stmt := range []string{
		`INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, created_at)
		 SELECT 'old-' || i, 'e' || i, 1, 'deposit_credited', '{}', 'delivered', now() - interval '30 days' FROM generate_series(1, 10) i`,
		`INSERT INTO transfer_reports (event_id, reporter, first_at)
		 SELECT 'e' || i, 'alchemy', now() - interval '30 days' FROM generate_series(1, 10) i`,
		`INSERT INTO transfer_sightings (event_id, block_hash, removed, reporter, first_at)
		 SELECT 'e' || i, '0x' || lpad(to_hex(i), 64, '0'), false, 'alchemy', now() - interval '30 days' FROM generate_series(1, 10) i`,
	} {
		_, err = conn.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	holder, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(ctx) })
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE transfer_reports IN SHARE MODE`)
	require.NoError(t, err)

	alerts := alert.New(zerolog.New(io.Discard), alert.Options{})
	t.Cleanup(alerts.Close)
	reg := prometheus.NewRegistry()
	job := cleanup(db, alerts, zerolog.New(io.Discard), reg, cleanupSettings{
		Retention: postgres.CleanupRetentionDefault, PartitionLockTimeout: 100 * time.Millisecond,
		Batch: 4, BatchTimeout: 300 * time.Millisecond,
	})
	// The job's hour, shortened.
	runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	err = job(runCtx)
	took := time.Since(start)
	count := func(query string) int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, query).Scan(&n))
		return n
	}
	require.Zero(t, count(`SELECT count(*) FROM notification_outbox`), "old notifications deleted")
	require.Zero(t, count(`SELECT count(*) FROM transfer_sightings`), "old sightings deleted all the same")
	require.Equal(t, 10, count(`SELECT count(*) FROM transfer_reports`), "left to the next run")
	require.ErrorContains(t, err, "transfer_reports", "the stuck table fails the run")
	// ~1 s normally; a batch that held the run would end with runCtx (20 s).
	require.Less(t, took, 15*time.Second, "the stuck batch held the run")

	families, err := reg.Gather()
	require.NoError(t, err)
	deleted := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "settle_cleanup_deleted_rows_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			deleted[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, 10.0, deleted["notification_outbox"])
	require.Equal(t, 10.0, deleted["transfer_sightings"])
	require.Zero(t, deleted["transfer_reports"])
}
