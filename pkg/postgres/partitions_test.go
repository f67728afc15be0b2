package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestPartitioningMigratesAPopulatedTable fills processed_events at the
// schema before partitioning, migrates, and checks that every record is
// still found, new days land in their own partitions, and cleanup drops
// whole days (never one with a pending record) and trims the old rows.
func TestPartitioningMigratesAPopulatedTable(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, 2)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, query, args...).Scan(&n))
		return n
	}

	// 2,000 records over the last 40 days, one still pending.
	const rows = 2000
	_, err = conn.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id, outcome, created_at)
		SELECT encode(sha256(('k' || i)::bytea), 'hex'), 'e' || i,
		       CASE WHEN i = 7 THEN 'pending' ELSE 'success' END,
		       now() - (i % 40) * interval '1 day'
		FROM generate_series(1, $1) i`, rows)
	require.NoError(t, err)

	applied, err := db.MigrateTo(ctx, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"0003_processed_events_partition_prepare.sql", "0004_processed_events_partition.sql"}, applied)
	require.Equal(t, rows, count(`SELECT count(*) FROM processed_events`), "every record survived")
	require.Equal(t, rows, count(`SELECT count(*) FROM processed_events_legacy`))
	require.Equal(t, 1, count(`SELECT count(*) FROM processed_events WHERE idempotency_key = encode(sha256('k7'::bytea), 'hex') AND outcome = 'pending'`))
	require.GreaterOrEqual(t, count(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'processed_events'::regclass`), 30)
	_, err = db.Migrate(ctx) // the rest of the schema, which the code of today expects
	require.NoError(t, err)

	// The ledger still sees old records (replay path) and writes new ones.
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	e := payment.Event{ID: "e5", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}
	_, err = conn.Exec(ctx, `UPDATE processed_events SET idempotency_key = $1 WHERE event_id = 'e5'`, e.Key())
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: e})
	require.NoError(t, err)
	fresh := payment.Event{ID: "new-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("2")}
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: fresh})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	// e5 comes back as a replayed event would (generation 1): the records
	// of such events are read, whatever partition they sit in.
	_, err = conn.Exec(ctx, `UPDATE payment_events SET generation = 1 WHERE event_id = 'e5'`)
	require.NoError(t, err)
	items := make([]postgres.LedgerItem, len(claimed))
	for i, c := range claimed {
		if c.Event.ID == "e5" {
			c.Event.Generation = 1
		}
		items[i] = postgres.LedgerItem{Event: c.Event}
	}
	results, err := db.ApplyBatch(ctx, items, postgres.LedgerOptions{})
	require.NoError(t, err)
	for _, r := range results {
		require.Equal(t, postgres.Applied, r.Kind)
		require.Equal(t, payment.OutcomeSuccess, r.Outcome)
	}
	require.Zero(t, count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'e5'`), "an old success record takes the replay path")
	require.Equal(t, 1, count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'new-1'`))

	// A record dated in three days lands in that day's partition.
	in3 := time.Now().UTC().Add(72 * time.Hour)
	_, err = conn.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id, outcome, created_at) VALUES (repeat('a', 64), 'x', 'success', $1)`, in3)
	require.NoError(t, err)
	require.Equal(t, 1, count(fmt.Sprintf(`SELECT count(*) FROM processed_events_p%s`, in3.Format("20060102"))))
	// A pending record in the partition of four days ahead.
	in4 := time.Now().UTC().Add(96 * time.Hour)
	_, err = conn.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id, outcome, created_at) VALUES (repeat('b', 64), 'y', 'pending', $1)`, in4)
	require.NoError(t, err)

	// Twenty days on, with 14 days of retention.
	later := time.Now().Add(20 * 24 * time.Hour)
	report, err := db.MaintainPartitions(ctx, 14*24*time.Hour, 30, later, postgres.PartitionOptions{})
	require.NoError(t, err)
	require.Greater(t, report.Dropped, 0)
	require.Contains(t, report.KeptPending, "processed_events_p"+in4.Format("20060102"), "a day with a pending record is kept")
	require.Zero(t, count(`SELECT count(*) FROM pg_class WHERE relname = $1`, "processed_events_p"+in3.Format("20060102")), "old days are dropped whole")
	require.Zero(t, report.DefaultRows)
	// The pre-partitioning rows older than 14 days (real time) were trimmed,
	// the pending one kept, the rest kept until they age.
	require.Greater(t, report.Trimmed, int64(0))
	require.Equal(t, 1, count(`SELECT count(*) FROM processed_events_legacy WHERE outcome = 'pending'`))
	require.Zero(t, count(`SELECT count(*) FROM processed_events_legacy WHERE outcome <> 'pending' AND created_at < now() - interval '14 days'`))
}

// TestPartitionDDLNeverStallsTheLedger: while another session holds ACCESS
// SHARE on processed_events (a pg_dump, say), the partition job's CREATE
// and DROP time out after their short lock timeout, are tried again a few
// times and then left for the next run, and deposits applied meanwhile
// commit within a second.
func TestPartitionDDLNeverStallsTheLedger(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	var lastDay time.Time
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '29 days'`).Scan(&lastDay))
	missing := "processed_events_p" + lastDay.UTC().Format("20060102")
	_, err := f.sql.Exec(ctx, "DROP TABLE "+missing)
	require.NoError(t, err)
	const deposits = 200
	tasks := make([]payment.Event, deposits)
	for i := range tasks {
		tasks[i] = f.enqueue(fmt.Sprintf("dump-%d", i), payment.Deposit, 1, "ETH", "1")
	}

	dump, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer dump.Close(ctx)
	tx, err := dump.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT * FROM processed_events LIMIT 1`)
	require.NoError(t, err)

	type result struct {
		report postgres.PartitionReport
		err    error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		// Retention such that today's partition is due for a drop.
		r, err := f.db.MaintainPartitions(ctx, 14*24*time.Hour, postgres.PartitionsAheadDefault, time.Now().Add(15*24*time.Hour),
			postgres.PartitionOptions{LockTimeout: 100 * time.Millisecond})
		done <- result{r, err}
	}()
	applied := 0
	var slowest time.Duration
	var maintained result
wait:
	for {
		select {
		case maintained = <-done:
			break wait
		default:
		}
		if applied == deposits {
			maintained = <-done
			break wait
		}
		begin := time.Now()
		// Every lock the deposit takes may wait at most a second: queued
		// behind the DDL any longer, it fails with a lock timeout. (Wall
		// time is reported, not asserted: a loaded machine is no stall.)
		results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: tasks[applied]}}, postgres.LedgerOptions{LockTimeout: time.Second})
		took := time.Since(begin)
		require.NoError(t, err, "deposit %d waited behind the partition DDL", applied)
		require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
		slowest = max(slowest, took)
		applied++
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, maintained.err)
	t.Logf("partition job took %s; %d deposits applied meanwhile, the slowest in %s", time.Since(started), applied, slowest)
	require.Greater(t, applied, 5, "deposits were applied while the DDL was trying")
	require.Contains(t, maintained.report.Deferred, missing, "the blocked CREATE is left for the next run")
	today := "processed_events_p" + time.Now().UTC().Format("20060102")
	require.Contains(t, maintained.report.Deferred, today, "the blocked DROP is left for the next run")
	require.Zero(t, maintained.report.Created)
	require.Zero(t, maintained.report.Dropped)

	// The dump ends; the next run does the work.
	require.NoError(t, tx.Rollback(ctx))
	report, err := f.db.MaintainPartitions(ctx, 14*24*time.Hour, postgres.PartitionsAheadDefault, time.Now(), postgres.PartitionOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, report.Created)
	require.Empty(t, report.Deferred)
	require.True(t, f.balance(1, "ETH").Equal(dec(fmt.Sprint(applied))))
	require.Equal(t, applied, f.count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	f.requireJournalInvariant()
}
