package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// seedCleanup writes, in each table the cleanup trims, old rows past a
// 14-day retention and young ones: 25 old and 3 young settled
// notifications plus 2 old pending ones; 25 old and 3 young transfer
// reports; 25 old and 3 young sightings of plain transfers, plus 3 old
// sightings of a transfer with a block reported removed; the found ids of
// rescan jobs: 25 of two that ended (done, failed), as a binary from
// before rescan_found leaves them, and 3 of a running one, all new.
func seedCleanup(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	for _, stmt := range []string{
		`INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, created_at)
		 SELECT 'old-' || i, 'e' || i, 1, 'deposit_credited', '{}', 'delivered', now() - interval '30 days' - i * interval '1 minute'
		 FROM generate_series(1, 25) i`,
		`INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, created_at)
		 SELECT 'young-' || i, 'e' || i, 1, 'deposit_credited', '{}', 'delivered', now() - interval '1 day'
		 FROM generate_series(1, 3) i`,
		`INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, created_at)
		 SELECT 'pending-' || i, 'e' || i, 1, 'deposit_credited', '{}', 'pending', now() - interval '30 days'
		 FROM generate_series(1, 2) i`,
		`INSERT INTO transfer_reports (event_id, reporter, first_at)
		 SELECT 'old-' || i, 'alchemy', now() - interval '30 days' - i * interval '1 minute' FROM generate_series(1, 25) i`,
		`INSERT INTO transfer_reports (event_id, reporter, first_at)
		 SELECT 'young-' || i, 'alchemy', now() - interval '1 day' FROM generate_series(1, 3) i`,
		`INSERT INTO transfer_sightings (event_id, block_hash, removed, reporter, first_at)
		 SELECT 'old-' || i, '0x' || lpad(to_hex(i), 64, '0'), false, 'alchemy', now() - interval '30 days' - i * interval '1 minute'
		 FROM generate_series(1, 25) i`,
		`INSERT INTO transfer_sightings (event_id, block_hash, removed, reporter, first_at)
		 SELECT 'young-' || i, '0x' || lpad(to_hex(i), 64, '0'), false, 'alchemy', now() - interval '1 day'
		 FROM generate_series(1, 3) i`,
		`INSERT INTO transfer_sightings (event_id, block_hash, removed, removed_at, reporter, first_at)
		 SELECT 'reorged', '0x' || lpad(to_hex(i), 64, '0'), i = 1, CASE WHEN i = 1 THEN now() END, 'alchemy', now() - interval '30 days'
		 FROM generate_series(1, 3) i`,
		`INSERT INTO rescan_jobs (id, network, from_block, to_block, next_block, status, error)
		 VALUES ('r-done', 'ETH_MAINNET', 1, 100, 101, 'done', NULL), ('r-failed', 'ETH_MAINNET', 1, 100, 50, 'failed', 'cancelled'),
		        ('r-running', 'ETH_MAINNET', 1, 100, 50, 'running', NULL)`,
		`INSERT INTO rescan_found (job_id, event_id, block_number)
		 SELECT CASE WHEN i <= 20 THEN 'r-done' ELSE 'r-failed' END, 'ended-' || i, CASE WHEN i % 2 = 0 THEN i END
		 FROM generate_series(1, 25) i`,
		`INSERT INTO rescan_found (job_id, event_id, block_number)
		 SELECT 'r-running', 'running-' || i, 40 + i FROM generate_series(1, 3) i`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err)
	}
}

func countRows(t *testing.T, ctx context.Context, conn *pgx.Conn, query string) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(ctx, query).Scan(&n))
	return n
}

// TestCleanupDeletesBacklogInBatches: a backlog larger than one batch is
// deleted whole, in batches of at most the batch size, each table in
// turn; young rows, pending notifications, the sightings of a transfer
// with a removed block and the found ids of a running rescan stay. The
// ids of rescans that ended go whatever their age: a binary from before
// rescan_found ending a job left them, and nothing else deleted them.
func TestCleanupDeletesBacklogInBatches(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	seedCleanup(t, ctx, conn)

	var order []string
	largest := map[string]int64{}
	tables, err := db.Cleanup(ctx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{
		Batch: 4, Pause: time.Millisecond,
		Deleted: func(table string, rows int64) {
			order = append(order, table)
			largest[table] = max(largest[table], rows)
		},
	})
	require.NoError(t, err)
	require.Len(t, tables, 4)
	for _, r := range tables {
		require.EqualValues(t, 25, r.Deleted, r.Table)
		require.Equal(t, 7, r.Batches, "%s: 25 rows in batches of 4", r.Table)
		require.True(t, r.Done, r.Table)
		require.NoError(t, r.Err)
		require.EqualValues(t, 4, largest[r.Table], "%s: no batch above the bound", r.Table)
	}
	require.Equal(t, []string{postgres.CleanupNotifications, postgres.CleanupTransferReports, postgres.CleanupSightings, postgres.CleanupRescanFound,
		postgres.CleanupNotifications, postgres.CleanupTransferReports, postgres.CleanupSightings, postgres.CleanupRescanFound}, order[:8],
		"the tables take turns")

	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM notification_outbox WHERE delivery_id LIKE 'young-%'`))
	require.Equal(t, 2, countRows(t, ctx, conn, `SELECT count(*) FROM notification_outbox WHERE status = 'pending'`))
	require.Equal(t, 5, countRows(t, ctx, conn, `SELECT count(*) FROM notification_outbox`))
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_reports`), "the young reports")
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_sightings WHERE event_id LIKE 'young-%'`))
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_sightings WHERE event_id = 'reorged'`),
		"a transfer with a removed block keeps all its sightings")
	require.Equal(t, 6, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_sightings`))
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM rescan_found WHERE job_id = 'r-running'`),
		"a running job's ids stay, however new")
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM rescan_found`), "the ended jobs' ids are gone")

	_, err = db.Cleanup(ctx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{Batch: postgres.CleanupBatchMax + 1})
	require.ErrorContains(t, err, "outside 1..")
}

// TestCleanupBatchStuckBehindLock: a batch that cannot get its lock ends
// at the batch timeout and ends only its own table's cleanup for the
// run; the other tables are cleaned all the same. A row locked by
// another transaction is passed over, never waited for.
func TestCleanupBatchStuckBehindLock(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	seedCleanup(t, ctx, conn)

	// A session holding SHARE on transfer_reports (CREATE INDEX takes it)
	// and one old sighting's row.
	holder, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(ctx) })
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE transfer_reports IN SHARE MODE`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM transfer_sightings WHERE event_id = 'old-7' FOR UPDATE`)
	require.NoError(t, err)

	runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	tables, err := db.Cleanup(runCtx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{
		Batch: 4, Pause: time.Millisecond, BatchTimeout: 300 * time.Millisecond,
	})
	took := time.Since(start)
	// ~1 s normally; a batch that held the run would end with runCtx (20 s).
	require.Less(t, took, 15*time.Second, "a stuck batch holds the run for its timeout, not the job's hour")
	require.ErrorContains(t, err, "transfer_reports")
	require.ErrorIs(t, err, payment.ErrRetryable, "a statement timeout, retried by the next run")
	require.NoError(t, runCtx.Err())

	require.Equal(t, postgres.CleanupTransferReports, tables[1].Table)
	require.Error(t, tables[1].Err)
	require.Zero(t, tables[1].Batches)
	require.Equal(t, 28, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_reports`), "stuck behind the lock, kept for the next run")
	require.NoError(t, tables[0].Err)
	require.Equal(t, 5, countRows(t, ctx, conn, `SELECT count(*) FROM notification_outbox`), "old notifications deleted all the same")
	require.NoError(t, tables[2].Err)
	require.EqualValues(t, 24, tables[2].Deleted, "every old sighting but the locked one")
	require.Equal(t, 1, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_sightings WHERE event_id LIKE 'old-%'`))

	require.NoError(t, tx.Rollback(ctx))
	tables, err = db.Cleanup(ctx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{Batch: 4})
	require.NoError(t, err)
	require.EqualValues(t, 25, tables[1].Deleted, "the next run takes up what was left")
	require.EqualValues(t, 1, tables[2].Deleted)
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_reports`))
	require.Equal(t, 3, countRows(t, ctx, conn, `SELECT count(*) FROM transfer_sightings WHERE event_id = 'reorged'`))
}

// TestCleanupStopsAtRunEnd: the run's end stops the batches between
// two, and the tables with rows left say so.
func TestCleanupStopsAtRunEnd(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	seedCleanup(t, ctx, conn)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := 0
	tables, err := db.Cleanup(runCtx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{
		Batch: 4,
		Deleted: func(string, int64) {
			if batches++; batches == 4 {
				cancel()
			}
		},
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 4, batches, "no batch after the run's end")
	for _, r := range tables {
		require.False(t, r.Done, r.Table)
		require.ErrorContains(t, r.Err, "rows left", r.Table)
	}
}

// TestCleanupForgetsEndedRescans: a job ended by a replica of a binary
// from before rescan_found (a rolling update) keeps its found ids, as
// rescan_jobs rows are never deleted for the cascade to run; the daily
// cleanup deletes them, and leaves a running job's. They stayed forever.
func TestCleanupForgetsEndedRescans(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	hash := "0x" + strings.Repeat("ab", 32)
	for i, id := range []string{"r-old-binary", "r-running"} {
		_, err = db.CreateRescan(ctx, id, "ETH_MAINNET", 10, 999, "op")
		require.NoError(t, err)
		c, ok, err := db.ClaimRescan(ctx, "ETH_MAINNET", 10_000, "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, id, c.ID)
		_, err = db.CompleteRescanPass(ctx, id, "a", 10, 29, hash, 128, []postgres.NewEvent{foundAt(2*i+1, 12), foundAt(2*i+2, 20)})
		require.NoError(t, err)
		if i == 0 {
			// The older binary's last pass: done, its ids left behind.
			_, err = conn.Exec(ctx, `UPDATE rescan_jobs SET status = 'done', next_block = 1000 WHERE id = $1`, id)
			require.NoError(t, err)
		}
	}

	tables, err := db.Cleanup(ctx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{Batch: 1, Pause: time.Millisecond})
	require.NoError(t, err)
	require.Zero(t, countRows(t, ctx, conn, `SELECT count(*) FROM rescan_found WHERE job_id = 'r-old-binary'`),
		"the ended job's ids, left by the older binary, are deleted")
	require.Equal(t, 2, countRows(t, ctx, conn, `SELECT count(*) FROM rescan_found WHERE job_id = 'r-running'`),
		"a running job keeps its ids")
	require.Len(t, tables, 4)
	require.Equal(t, postgres.CleanupRescanFound, tables[3].Table)
	require.EqualValues(t, 2, tables[3].Deleted)
	require.Equal(t, 3, tables[3].Batches, "batches of 1: two full, the third finds none left")
}
