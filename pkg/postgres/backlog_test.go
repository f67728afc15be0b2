package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TestBacklog counts live events per status and network (an event's
// network is its asset's), failed events with an open dead letter once
// each, never terminal events otherwise, and the oldest pending age.
func TestBacklog(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.user(1, map[string]string{"ETH": "100"})
	_, err := f.sql.Exec(ctx, `INSERT INTO assets (code, network, decimals) VALUES ('XPOL', 'POLYGON', 18)`)
	require.NoError(t, err)

	empty, err := f.db.Backlog(ctx, time.Second)
	require.NoError(t, err)
	require.Empty(t, empty.Counts)
	require.Zero(t, empty.OldestPending)

	// confirmed: counted nowhere.
	f.apply(f.enqueue("done", payment.Deposit, 1, "ETH", "1"))
	// failed with two open dead letters: one event; one resolved: none.
	dl := f.enqueue("dl", payment.Withdrawal, 1, "XPOL", "1")
	f.deadLetter(dl, "boom")
	_, err = f.sql.Exec(ctx, `INSERT INTO dead_letter_queue (event_id, event_type, error, source) VALUES ('dl', 'withdrawal', 'again', 'worker')`)
	require.NoError(t, err)
	gone := f.enqueue("gone", payment.Withdrawal, 1, "ETH", "1")
	id := f.deadLetter(gone, "boom")
	_, err = f.sql.Exec(ctx, `UPDATE dead_letter_queue SET resolution = 'discarded', resolved_at = now(), resolved_by = 't' WHERE id = $1`, id)
	require.NoError(t, err)
	// enqueued on ETH_MAINNET, one moved on to awaiting_finality.
	f.enqueue("enq-1", payment.Deposit, 1, "ETH", "1")
	f.enqueue("wait-1", payment.Deposit, 1, "USDC", "1")
	_, err = f.sql.Exec(ctx, `UPDATE payment_events SET status = 'awaiting_finality', next_check_at = now() WHERE event_id = 'wait-1'`)
	require.NoError(t, err)
	// pending: two on POLYGON, one on ETH_MAINNET, the oldest 10 minutes old.
	for _, e := range []payment.Event{
		{ID: "p-1", Type: payment.Deposit, UserID: 1, Asset: "XPOL", Amount: dec("1")},
		{ID: "p-2", Type: payment.Deposit, UserID: 1, Asset: "XPOL", Amount: dec("1")},
		{ID: "p-3", Type: payment.Deposit, UserID: 1, Asset: "DAI", Amount: dec("1")},
	} {
		inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
	}
	_, err = f.sql.Exec(ctx, `UPDATE payment_events SET created_at = now() - interval '10 minutes' WHERE event_id = 'p-2'`)
	require.NoError(t, err)

	b, err := f.db.Backlog(ctx, time.Second)
	require.NoError(t, err)
	got := map[string]int64{}
	for _, c := range b.Counts {
		got[c.Status+"/"+c.Network] = c.Events
	}
	require.Equal(t, map[string]int64{
		"pending/POLYGON":               2,
		"pending/ETH_MAINNET":           1,
		"enqueued/ETH_MAINNET":          1,
		"awaiting_finality/ETH_MAINNET": 1,
		"failed/POLYGON":                1,
	}, got)
	require.InDelta(t, (10 * time.Minute).Seconds(), b.OldestPending.Seconds(), 30)
}

// TestBacklogReadsOnlyLiveIndexes: the plan never scans payment_events
// sequentially, even when the planner believes the table is tiny.
func TestBacklogReadsOnlyLiveIndexes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, name := range []string{"backlog_counts", "backlog_oldest_pending"} {
		tx, err := f.sql.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, postgres.QueryText("backlog_settings"), "1000ms")
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN "+postgres.QueryText(name))
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, tx.Rollback(ctx))
		text := strings.Join(plan, "\n")
		require.NotContains(t, text, "Seq Scan on payment_events", "%s:\n%s", name, text)
		require.Contains(t, text, "payment_events_pending", "%s reads the pending index:\n%s", name, text)
	}
}

// TestBacklogTimeout: a read slower than its bound fails (the gauges keep
// their last values) instead of stalling.
func TestBacklogTimeout(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// Hold a lock the read must wait for: an ACCESS EXCLUSIVE lock on assets.
	tx, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE assets IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	start := time.Now()
	_, err = f.db.Backlog(ctx, 200*time.Millisecond)
	require.Error(t, err)
	require.ErrorIs(t, err, payment.ErrRetryable, "a timeout is retryable: %v", err)
	require.Less(t, time.Since(start), 5*time.Second)

	// Below a millisecond is still a bound, never PostgreSQL's 0 (none).
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start = time.Now()
	_, err = f.db.Backlog(bounded, time.Microsecond)
	require.ErrorIs(t, err, payment.ErrRetryable)
	require.NoError(t, bounded.Err(), "the statement timeout, not the test's deadline, ended it")
	require.Less(t, time.Since(start), 4*time.Second)
}
