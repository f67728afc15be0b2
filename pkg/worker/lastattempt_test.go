package worker_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

// TestGracefulStopOnTheLastAttemptHandsTheTaskBack: a graceful stop
// hands back a task in flight ("retried elsewhere, never lost"). asynq
// requeues a task still running at ShutdownTimeout and cancels its
// handler's context; a handler on its last attempt must not take that
// "context canceled" for its own failure and dead-letter the event, or
// the requeued task finds it failed. (MaxRetry(0) stands for the 5th
// retry of 5: both are a last attempt.)
func TestGracefulStopOnTheLastAttemptHandsTheTaskBack(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{noEnqueuer: true, lock: 30 * time.Second})
	p.user(1, map[string]string{"ETH": "100"})
	p.accept("sd-withdrawal", payment.Withdrawal, 1, "ETH", "10")
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 32)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	// Keep the ledger busy past the shutdown timeout (2s in the pipeline).
	holder, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id = 1 FOR UPDATE`)
	require.NoError(t, err)

	queued, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	opts = append(opts, asynq.MaxRetry(0)) // its last attempt
	_, err = asynq.NewClientFromRedisClient(p.rdb).Enqueue(queued, opts...)
	require.NoError(t, err)
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("the task active", 10*time.Second, func() bool {
		info, err := inspector.GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
		return err == nil && info.State == asynq.TaskStateActive
	})
	time.Sleep(200 * time.Millisecond) // in the ledger, waiting for the lock

	p.server.Shutdown() // SIGTERM: the task in flight must be handed back
	p.server = nil
	time.Sleep(time.Second) // the orphaned handler returns meanwhile
	require.NoError(t, tx.Rollback(ctx))

	// The worker "elsewhere" takes the handed-back task.
	log := zerolog.New(io.Discard)
	batcher := worker.NewBatcher(p.db, postgres.LedgerOptions{LockTimeout: time.Second}, 32, 1, prometheus.NewRegistry())
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go batcher.Run(bctx)
	handler := worker.NewWorker(worker.WorkerOptions{Log: log, Batcher: batcher, DeadLetters: p.sink, Alerts: p.alerts})
	other := asynq.NewServerFromRedisClient(p.rdb, asynq.Config{
		Concurrency: 2, Queues: worker.QueueWeights, TaskCheckInterval: 10 * time.Millisecond,
		IsFailure: worker.IsFailure, ShutdownTimeout: time.Second, LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, other.Start(handler))
	defer other.Shutdown()

	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'sd-withdrawal' AND status IN ('confirmed','failed')`) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	var status, outcome, errText string
	require.NoError(t, p.sql.QueryRow(ctx, `SELECT status, COALESCE(outcome,''), COALESCE(error,'') FROM payment_events WHERE event_id = 'sd-withdrawal'`).Scan(&status, &outcome, &errText))
	require.Equal(t, "confirmed", status,
		"a graceful shutdown dead-lettered the task it handed back: outcome=%s error=%q dlq rows=%d",
		outcome, errText, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'sd-withdrawal'`))
	require.Equal(t, "90", p.balance(1, "ETH"))
}
