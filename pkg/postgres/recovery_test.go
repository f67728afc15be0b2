package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TestRecoveryHoldsNoLockWhileItAsks: the question to the queue (decide)
// runs with no row of the stale events locked, so a slow Redis never
// stalls the ledger; a decision written after the event moved on (another
// scheduler recovered it, or the ledger settled it) changes nothing.
func TestRecoveryHoldsNoLockWhileItAsks(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	f.enqueue("stale-a", payment.Deposit, 1, "ETH", "1")
	f.enqueue("stale-b", payment.Deposit, 1, "ETH", "1")
	_, err := f.sql.Exec(ctx, `UPDATE payment_events SET updated_at = now() - interval '1 hour'`)
	require.NoError(t, err)

	var lockErrs []error
	decide := func(ctx context.Context, s postgres.StaleEvent) (postgres.RecoveryAction, string) {
		tx, err := f.sql.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE NOWAIT`, s.Event.ID)
		lockErrs = append(lockErrs, err)
		require.NoError(t, tx.Rollback(ctx))
		if s.Event.ID == "stale-b" {
			// Someone else recovers it while we ask (never waiting on a
			// lock recovery might hold).
			tx, err := f.sql.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `UPDATE payment_events SET status = 'pending', generation = generation + 1 WHERE event_id = 'stale-b'`)
			lockErrs = append(lockErrs, err)
			require.NoError(t, tx.Commit(ctx))
		}
		return postgres.RecoveryRequeue, ""
	}
	report, err := f.db.RecoverStale(ctx, time.Minute, 10, postgres.StaleCursor{}, decide)
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil, nil}, lockErrs, "rows were locked while the queue was asked")
	require.Equal(t, 2, report.Examined)
	require.Equal(t, 1, report.Requeued)
	require.Equal(t, 1, report.Failed, "the decision about an event that moved on is refused")
	require.Equal(t, 1, f.count(`SELECT generation FROM payment_events WHERE event_id = 'stale-a'`))
	require.Equal(t, 1, f.count(`SELECT generation FROM payment_events WHERE event_id = 'stale-b'`), "recovered once, not twice")
	require.Equal(t, 1, f.count(`SELECT retry_count FROM payment_events WHERE event_id = 'stale-a'`))
	require.Equal(t, 0, f.count(`SELECT retry_count FROM payment_events WHERE event_id = 'stale-b'`))
}

// TestStaleEventsPageByCursor: pages of stale events follow one another
// by (updated_at, event_id), so events enqueued in one transaction (one
// updated_at) are each read once, and an event left alone is not read
// again by the next page.
func TestStaleEventsPageByCursor(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	for _, id := range []string{"c", "a", "b"} {
		f.enqueue(id, payment.Deposit, 1, "ETH", "1")
	}
	_, err := f.sql.Exec(ctx, `UPDATE payment_events SET updated_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	var read []string
	skip := func(_ context.Context, s postgres.StaleEvent) (postgres.RecoveryAction, string) {
		read = append(read, s.Event.ID)
		return postgres.RecoverySkip, ""
	}
	var cursor postgres.StaleCursor
	for range 4 {
		report, err := f.db.RecoverStale(ctx, time.Minute, 1, cursor, skip)
		require.NoError(t, err)
		if report.Examined == 0 {
			require.Equal(t, cursor, report.Next, "an empty page leaves the cursor where it was")
			break
		}
		cursor = report.Next
	}
	require.Equal(t, []string{"a", "b", "c"}, read)
}
