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
	job := cleanup(db, alerts, zerolog.New(io.Discard), prometheus.NewRegistry(), postgres.CleanupRetentionDefault, 100*time.Millisecond)
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
