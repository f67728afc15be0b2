package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"sync"
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
	p.waitFor("the ledger waiting for the lock", 10*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})

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

	// Generous: a loaded machine is slow to settle, and the loop ends at
	// the first terminal status, a wrong one too.
	deadline := time.Now().Add(30 * time.Second)
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

// TestOutageOnTheLastAttemptIsNotDeadLettered: an outage is not the
// event's fault and never spends its budget (IsFailure). A task whose
// budget lock timeouts have spent, run while PostgreSQL is down, must
// wait for the database like every other task, not dead-letter its event
// (parked in Redis, failed by the drain). (MaxRetry(0) stands for the
// 5th retry of 5: both are a last attempt.)
func TestOutageOnTheLastAttemptIsNotDeadLettered(t *testing.T) {
	ctx := context.Background()
	pg, dsn := outagePostgres(t)

	p := newPipeline(t, pipelineOptions{dsn: dsn, noEnqueuer: true, retryDelay: 10 * time.Millisecond})
	p.user(1, map[string]string{"ETH": "0"})
	p.accept("outage-last", payment.Deposit, 1, "ETH", "1")
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 32)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	pg.Stop()
	queued, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	opts = append(opts, asynq.MaxRetry(0)) // its last attempt
	_, err = asynq.NewClientFromRedisClient(p.rdb).Enqueue(queued, opts...)
	require.NoError(t, err)
	time.Sleep(2 * time.Second) // the worker meets the outage
	require.NoError(t, pg.Start(ctx))

	// The scheduler's drain_dlq job runs every minute.
	_, err = p.sink.Drain(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	var status, outcome, errText string
	for time.Now().Before(deadline) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT status, COALESCE(outcome,''), COALESCE(error,'') FROM payment_events WHERE event_id = 'outage-last'`).Scan(&status, &outcome, &errText))
		if status == "confirmed" || status == "failed" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, _ := asynq.NewInspectorFromRedisClient(p.rdb).GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
	state := "gone"
	if info != nil {
		state = info.State.String()
	}
	require.Equal(t, "confirmed", status, "an outage dead-lettered the event: outcome=%s error=%q task=%s", outcome, errText, state)
}

// TestOutageOutlastingTheLastAttemptLeavesTheEventToRecovery: a last
// attempt whose deadline leaves no room for another run returns the
// outage at once; asynq archives the task, and the event stays
// 'enqueued' for stale recovery, never dead-lettered.
func TestOutageOutlastingTheLastAttemptLeavesTheEventToRecovery(t *testing.T) {
	ctx := context.Background()
	pg, dsn := outagePostgres(t)

	lines := &logLines{}
	p := newPipeline(t, pipelineOptions{dsn: dsn, noEnqueuer: true, retryDelay: 10 * time.Millisecond, log: lines})
	p.user(1, map[string]string{"ETH": "0"})
	p.accept("outage-short", payment.Deposit, 1, "ETH", "1")
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 32)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	pg.Stop()
	queued, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	// Its last attempt, with a deadline too close for another run.
	opts = append(opts, asynq.MaxRetry(0), asynq.Timeout(5*time.Second))
	_, err = asynq.NewClientFromRedisClient(p.rdb).Enqueue(queued, opts...)
	require.NoError(t, err)
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("the task archived", hangGuard, func() bool {
		info, err := inspector.GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	// paymentTask's decision, as it logs it: the run met the outage, and
	// the attempt returned it instead of pausing to run again.
	require.Zero(t, lines.count(lastAttemptWaits), "the last attempt waited although its deadline left no room")
	require.Equal(t, 1, lines.count("payment event will be retried"), "runs that met the outage")
	require.NoError(t, pg.Start(ctx))

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var status string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM payment_events WHERE event_id = 'outage-short'`).Scan(&status))
	require.Equal(t, "enqueued", status)
	parked, err := p.sink.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, parked, "an outage parked a dead letter")
	var letters int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM dead_letter_queue`).Scan(&letters))
	require.Zero(t, letters)
}

// lastAttemptWaits is what paymentTask logs as a last attempt pauses to
// run again after an outage.
const lastAttemptWaits = "last attempt met an outage; waiting to run again"

// logLines keeps the messages of the JSON lines a zerolog logger writes
// (one line a Write).
type logLines struct {
	mu       sync.Mutex
	messages []string
}

func (l *logLines) Write(b []byte) (int, error) {
	var line struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &line); err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.messages = append(l.messages, line.Message)
	l.mu.Unlock()
	return len(b), nil
}

// count is how many lines carried message.
func (l *logLines) count(message string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.messages {
		if m == message {
			n++
		}
	}
	return n
}
