package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/periodic"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/pkg/worker"
)

// runMainEnv makes the test binary act as the scheduler binary, so a test
// exercises the real main.
const runMainEnv = "SETTLE_TEST_RUN_SCHEDULER_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testenv.Main(m)
}

// TestMaintenanceTaskWakesTheWorkers: the job enqueues one task per
// period and leaves the wake-up that names its queue, once: a second
// run in the same period (another scheduler's) enqueues and wakes
// nothing.
func TestMaintenanceTaskWakesTheWorkers(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	require.NoError(t, rdb.Del(ctx, task.WakeList).Err())

	client := asynq.NewClientFromRedisClient(rdb)
	job := enqueueMaintenance(client, rdb, task.QueueNotifications, task.TypeNotify, time.Hour)
	require.NoError(t, job(ctx))
	require.NoError(t, job(ctx))

	wakes, err := rdb.LRange(ctx, task.WakeList, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{task.WakeQueuePrefix + task.QueueNotifications}, wakes,
		"one wake-up naming the queue, none for the second run's task that was not enqueued")
	n, err := rdb.LLen(ctx, task.PendingListKey(task.QueueNotifications)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// TestMaintenanceTaskNamedByItsClaimedPeriod: the task id comes from the
// period the scheduler claimed on the database's clock, not from its own
// clock: two periods' runs in one instant of a skewed replica are two
// tasks, not one taken for the other's duplicate.
func TestMaintenanceTaskNamedByItsClaimedPeriod(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	queue := task.QueueMaintenance
	require.NoError(t, rdb.Del(ctx, task.PendingListKey(queue)).Err())

	job := enqueueMaintenance(asynq.NewClientFromRedisClient(rdb), rdb, queue, task.TypeWatchReorgs, time.Hour)
	start := time.Now().Truncate(time.Hour)
	require.NoError(t, job(periodic.WithJobPeriod(ctx, start.Add(-time.Hour))))
	// A worker takes it (active: out of the pending list, its id still
	// taken), so the next period's task is not skipped as waiting.
	first, err := rdb.LPop(ctx, task.PendingListKey(queue)).Result()
	require.NoError(t, err)
	require.NoError(t, job(periodic.WithJobPeriod(ctx, start)))
	pending, err := rdb.LRange(ctx, task.PendingListKey(queue), 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, pending, 1, "the claimed period's own task")
	require.NotEqual(t, first, pending[0], "not taken for the running task's duplicate")
	_, err = rdb.LPop(ctx, task.PendingListKey(queue)).Result()
	require.NoError(t, err)
	require.NoError(t, job(periodic.WithJobPeriod(ctx, start)), "the same period again: a duplicate")
	n, err := rdb.LLen(ctx, task.PendingListKey(queue)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "one task per claimed period")
}

type noAlerts struct{}

func (noAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// TestNotifyTaskOutlastsASlowReceiver: the deliver_notifications job
// runs every NOTIFY_INTERVAL (2s by default), while a POST may take
// notify.RequestTimeout (5s). A receiver that answers 200 in 2.5s must
// have the notification recorded delivered; with a task timeout of the
// interval, the deadline cut the request first, and the notification was
// sent again and again (and, after AttemptsMax, marked failed) although
// every copy reached the receiver.
func TestNotifyTaskOutlastsASlowReceiver(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("1")))
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "w", Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("5"), TraceID: "tr"}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	results, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	require.Equal(t, payment.OutcomeInsufficientFunds, results[0].Outcome) // one notification written

	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		time.Sleep(2500 * time.Millisecond) // well within notify.RequestTimeout
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	require.Greater(t, notify.RequestTimeout, 2500*time.Millisecond)

	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	log := zerolog.New(io.Discard)
	handler := worker.NewWorker(worker.WorkerOptions{Log: log, Alerts: noAlerts{},
		Notify: notify.New(db, srv.URL, []byte("0123456789abcdef0123456789abcdef"), log, noAlerts{}, nil).Deliver})
	server := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 2, Queues: worker.QueueWeights,
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	require.NoError(t, server.Start(handler))
	defer server.Shutdown()

	// The scheduler's job, at NOTIFY_INTERVAL's default (2s).
	job := enqueueMaintenance(asynq.NewClientFromRedisClient(rdb), rdb, task.QueueNotifications, task.TypeNotify, 2*time.Second)
	require.NoError(t, job(ctx))

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	deadline := time.Now().Add(8 * time.Second)
	var status, lastError string
	for time.Now().Before(deadline) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT status, COALESCE(last_error, '') FROM notification_outbox`).Scan(&status, &lastError))
		if status != "pending" || lastError != "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, "delivered", status,
		"the receiver got %d POST(s) and answered 200, yet the attempt was recorded as %q", posts.Load(), lastError)
}

// TestMaintenanceTasksDoNotPileUpWhileWorkersAreDown: a period whose
// queue still holds a waiting task of the job enqueues no other: that one,
// started later, does this period's work too. Each period's own task
// piled up for as long as no worker ran (NOTIFY_INTERVAL's 2s: 1800 an
// hour, 86,400 over a weekend), in Redis and then in the workers' slots,
// beside the payments, when they came back.
func TestMaintenanceTasksDoNotPileUpWhileWorkersAreDown(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	queue := task.QueueNotifications
	job := enqueueMaintenance(asynq.NewClientFromRedisClient(rdb), rdb, queue, task.TypeNotify, 2*time.Second)
	start := time.Now().Truncate(2 * time.Second)
	for i := range 50 {
		require.NoError(t, job(periodic.WithJobPeriod(ctx, start.Add(time.Duration(i)*2*time.Second))))
	}
	n, err := rdb.LLen(ctx, task.PendingListKey(queue)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "tasks waiting for a worker after 50 periods")
}
