package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

// TestLockOnAHotTableDeadLettersNoGoodEvent: a session (a migration, an
// operator's CREATE INDEX, ALTER or VACUUM FULL) holds a lock on a hot
// table for longer than a retry budget lasts while events are processed.
// The ledger's statements time out on it, which is no event's fault: once
// it is released every event settles exactly once and none is
// dead-lettered. (With a 100 ms lock timeout and 20–40 ms retry delays, a
// budget of six attempts lasts about a second here; the lock is held 5 s.)
// SHARE (CREATE INDEX's) fails every attempt with a lock timeout. Under
// ACCESS EXCLUSIVE only a connection's first attempt does: pgx drops the
// failed batch's prepared statements, and their new Parse waits for the
// lock before the transaction's lock_timeout is set.
func TestLockOnAHotTableDeadLettersNoGoodEvent(t *testing.T) {
	for _, lock := range []struct{ table, mode string }{
		{"payment_events", "SHARE"}, {"balances", "SHARE"},
		{"payment_events", "ACCESS EXCLUSIVE"}, {"balances", "ACCESS EXCLUSIVE"},
	} {
		table := lock.table
		t.Run(table+" "+lock.mode, func(t *testing.T) {
			// Isolated (a database and a Redis database of its own) and
			// mostly asleep while the lock is held.
			t.Parallel()
			ctx := context.Background()
			p := newPipeline(t, pipelineOptions{
				noEnqueuer: true, lock: 100 * time.Millisecond, retryDelay: 20 * time.Millisecond,
				contentionWindow: time.Minute, workerConns: 1,
			})
			const users = 4
			for u := int64(1); u <= users; u++ {
				p.user(u, map[string]string{"ETH": "100"})
			}
			// Warm the ledger's connection first, as in a running worker: a
			// statement's first Parse on a connection takes its table locks
			// before the transaction's lock_timeout is set, and waits.
			client := asynq.NewClientFromRedisClient(p.rdb)
			for round := range 3 {
				for u := int64(1); u <= users; u++ {
					p.accept(fmt.Sprintf("warm-%d-%d", round, u), payment.Deposit, u, "ETH", "1")
				}
				p.enqueueClaim(client, 2)
				p.waitFor("the warm-up settled", 20*time.Second, p.allTerminal)
			}
			for u := int64(1); u <= users; u++ {
				p.accept(fmt.Sprintf("lock-d%d", u), payment.Deposit, u, "ETH", "5")
				p.accept(fmt.Sprintf("lock-w%d", u), payment.Withdrawal, u, "ETH", "10")
			}
			claimed, err := p.db.ClaimOutbox(ctx, 100, 0, 2)
			require.NoError(t, err)
			require.Len(t, claimed, 2*users)

			holder, err := pgx.Connect(ctx, p.dsn)
			require.NoError(t, err)
			defer holder.Close(ctx)
			tx, err := holder.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `LOCK TABLE `+table+` IN `+lock.mode+` MODE`)
			require.NoError(t, err)

			p.enqueue(client, claimed)
			time.Sleep(5 * time.Second)
			require.NoError(t, tx.Rollback(ctx))

			p.waitFor("every event settled", 30*time.Second, p.allTerminal)
			parked, err := p.sink.Pending(ctx)
			require.NoError(t, err)
			require.Zero(t, parked, "dead letters parked in Redis while the table was locked")
			require.Zero(t, p.count(`SELECT count(*) FROM dead_letter_queue`), "good events dead-lettered by a lock on %s", table)
			require.Zero(t, p.alerts.count("dead_letter"))
			require.Equal(t, 5*users, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`))
			for u := int64(1); u <= users; u++ {
				require.Equal(t, "98", p.balance(u, "ETH"))
			}
			p.requireInvariants()
		})
	}
}

// enqueueClaim claims every pending event in tasks of taskMax and
// enqueues them.
func (p *pipeline) enqueueClaim(client *asynq.Client, taskMax int) {
	p.t.Helper()
	claimed, err := p.db.ClaimOutbox(context.Background(), 100, 0, taskMax)
	require.NoError(p.t, err)
	p.enqueue(client, claimed)
}

// enqueue hands claimed events to asynq under their tasks, with extra
// options (a shorter timeout) after the usual ones.
func (p *pipeline) enqueue(client *asynq.Client, claimed []postgres.Claimed, extra ...asynq.Option) {
	p.t.Helper()
	tasks := map[string][]postgres.Claimed{}
	for _, c := range claimed {
		tasks[c.TaskID] = append(tasks[c.TaskID], c)
	}
	for _, events := range tasks {
		queued, opts, err := task.NewPaymentBatch(events)
		require.NoError(p.t, err)
		_, err = client.Enqueue(queued, append(opts, extra...)...)
		require.NoError(p.t, err)
	}
}
