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
	"github.com/settle/settle/pkg/task"
)

// TestLongLockOutlastingTaskTimeoutsDeadLettersNoGoodEvent: an ACCESS
// EXCLUSIVE lock (VACUUM FULL, a slow ALTER, a migration) held longer than
// every run of a task together. The ledger's statements, prepared again on
// a new connection, wait for it past the batch's bound, and the batches
// queued behind them keep tasks waiting for the ledger past their own
// timeout: ten tasks of 32 events in flight (the scheduler's
// TASK_EVENTS_MAX) are ten batches of 32 here, five of 64 in production.
// No event is at fault: once the lock is gone every event settles
// exactly once and none is dead-lettered. The bounds are the worker's,
// shortened in the same ratio: a task's run 2 s (60 s), a batch 1 s
// (30 s); the lock is held 15 s, past six runs of 2 s.
func TestLongLockOutlastingTaskTimeoutsDeadLettersNoGoodEvent(t *testing.T) {
	const taskTimeout, held = 2 * time.Second, 15 * time.Second
	require.Greater(t, held, time.Duration(task.RetryMax+1)*taskTimeout)
	for _, table := range []string{"payment_events", "balances"} {
		t.Run(table, func(t *testing.T) {
			// Each table's run has a database and a Redis database of its
			// own, and mostly sleeps while the lock is held.
			t.Parallel()
			ctx := context.Background()
			p := newPipeline(t, pipelineOptions{
				noEnqueuer: true, lock: 100 * time.Millisecond, retryDelay: 20 * time.Millisecond,
				contentionWindow: time.Minute, workerConns: 1, batchTimeout: taskTimeout / 2,
			})
			const users, each = 8, 20
			for u := int64(1); u <= users; u++ {
				p.user(u, map[string]string{"ETH": "100"})
			}
			client := asynq.NewClientFromRedisClient(p.rdb)
			for u := int64(1); u <= users; u++ {
				p.accept(fmt.Sprintf("warm-%d", u), payment.Deposit, u, "ETH", "1")
			}
			p.enqueueClaim(client, 2)
			p.waitFor("the warm-up settled", 20*time.Second, p.allTerminal)
			for u := int64(1); u <= users; u++ {
				for i := range each {
					p.accept(fmt.Sprintf("lock-d%d-%d", u, i), payment.Deposit, u, "ETH", "5")
					p.accept(fmt.Sprintf("lock-w%d-%d", u, i), payment.Withdrawal, u, "ETH", "1")
				}
			}
			claimed, err := p.db.ClaimOutbox(ctx, 2*users*each, 0, 32)
			require.NoError(t, err)
			require.Len(t, claimed, 2*users*each)

			holder, err := pgx.Connect(ctx, p.dsn)
			require.NoError(t, err)
			defer holder.Close(ctx)
			tx, err := holder.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)

			p.enqueue(client, claimed, asynq.Timeout(taskTimeout))
			time.Sleep(held)
			spent := p.retriesSpent()
			require.NoError(t, tx.Rollback(ctx))

			p.waitFor("every event settled", 60*time.Second, p.allTerminal)
			parked, err := p.sink.Pending(ctx)
			require.NoError(t, err)
			require.Zero(t, parked, "dead letters parked in Redis while %s was locked", table)
			require.Zero(t, p.count(`SELECT count(*) FROM dead_letter_queue`), "good events dead-lettered by a lock on %s", table)
			require.Zero(t, p.alerts.count("dead_letter"))
			// Nor did the lock spend retries (asynq spends one on a run
			// past its deadline, whatever the run returns).
			require.Zero(t, spent, "tasks spent retries waiting for a ledger stuck behind a lock on %s", table)
			const events = users * (1 + 2*each)
			require.Equal(t, events, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`))
			require.Equal(t, events, p.count(`SELECT count(*) FROM balance_events`))
			for u := int64(1); u <= users; u++ {
				require.Equal(t, "181", p.balance(u, "ETH"))
			}
			p.requireInvariants()
		})
	}
}

// retriesSpent sums the retries the payment queue's tasks have spent,
// counting an archived task as its whole budget.
func (p *pipeline) retriesSpent() int {
	p.t.Helper()
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	spent := 0
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		inspector.ListPendingTasks, inspector.ListActiveTasks, inspector.ListScheduledTasks,
		inspector.ListRetryTasks, inspector.ListArchivedTasks,
	} {
		tasks, err := list(task.QueuePayments, asynq.PageSize(1000))
		require.NoError(p.t, err)
		for _, info := range tasks {
			if info.State == asynq.TaskStateArchived {
				spent += info.MaxRetry + 1
				continue
			}
			spent += info.Retried
		}
	}
	return spent
}
