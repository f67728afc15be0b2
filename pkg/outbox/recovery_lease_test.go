package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

// TestRecoveryLeavesATaskALiveWorkerHolds: a stale event whose task a
// live worker is running (active, its lease extended by the worker's
// heartbeat) is left alone; only once the lease is gone (the worker died)
// is it a zombie and recovered. Judged by age alone, the active task was
// requeued and a second task did the work again.
func TestRecoveryLeavesATaskALiveWorkerHolds(t *testing.T) {
	ctx := context.Background()
	db, rdb, conn, taskID := staleTaskHeldByWorker(t)
	r := &outbox.Recovery{Store: db, Inspector: asynq.NewInspectorFromRedisClient(rdb), Leases: outbox.RedisRecovery{Redis: rdb},
		Alerts: noAlerts{}, Log: zerolog.Nop(), StaleAfter: 3 * time.Minute, MaxAttempts: 10, BatchMax: 10}
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "enqueued", status(t, conn, "held"), "a task a live worker holds was taken for a zombie")

	// The worker's lease gone (the heartbeat only extends a lease that
	// exists): a zombie, recovered.
	require.NoError(t, rdb.ZRem(ctx, "asynq:{"+task.QueuePayments+"}:lease", taskID).Err())
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "pending", status(t, conn, "held"), "an active task with no lease was left alone")
}

// failingLeases is a lease read that fails, as a Redis timeout would.
type failingLeases struct{}

func (failingLeases) LeaseExpiry(context.Context, string, string) (time.Time, bool, error) {
	return time.Time{}, false, errors.New("i/o timeout")
}

// TestRecoveryLeavesAnActiveTaskWhoseLeaseIsUnreadable: asynq says the
// task is active but its lease cannot be read: its worker may be running
// it, so it is left for the next run; requeued, a second task did the
// work again.
func TestRecoveryLeavesAnActiveTaskWhoseLeaseIsUnreadable(t *testing.T) {
	ctx := context.Background()
	db, rdb, conn, _ := staleTaskHeldByWorker(t)
	r := &outbox.Recovery{Store: db, Inspector: asynq.NewInspectorFromRedisClient(rdb), Leases: failingLeases{},
		Alerts: noAlerts{}, Log: zerolog.Nop(), StaleAfter: 3 * time.Minute, MaxAttempts: 10, BatchMax: 10}
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "enqueued", status(t, conn, "held"), "an active task whose lease was unreadable was requeued")
	var generation int
	require.NoError(t, conn.QueryRow(ctx, `SELECT generation FROM payment_events WHERE event_id = 'held'`).Scan(&generation))
	require.Zero(t, generation, "a new generation was sent out")
}

// staleTaskHeldByWorker enqueues the event "held" to a real worker that
// holds it until the test ends, and makes the event stale; it returns
// the database and the task's id.
func staleTaskHeldByWorker(t *testing.T) (*postgres.DB, redis.UniversalClient, *pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "held", Type: payment.Deposit, UserID: 1,
		Asset: "ETH", Amount: decimal.RequireFromString("1"), TraceID: "t-held"}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, 1)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	tk, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	client := asynq.NewClientFromRedisClient(rdb)
	info, err := client.Enqueue(tk, opts...)
	require.NoError(t, err)

	// A real worker takes the task and holds it until released.
	started, release := make(chan struct{}), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{task.QueuePayments: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: 2 * time.Second})
	mux := asynq.NewServeMux()
	mux.HandleFunc(task.TypePayment, func(ctx context.Context, _ *asynq.Task) error {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	t.Cleanup(func() { close(release) }) // runs before the shutdown
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never took the task")
	}

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `UPDATE payment_events SET updated_at = now() - interval '10 minutes' WHERE event_id = 'held'`)
	require.NoError(t, err)
	return db, rdb, conn, info.ID
}

// TestRecoveryResumesOnAnotherReplica: the resume point lives in Redis,
// so a run on another scheduler replica (or after a restart) goes on
// where the last stopped; kept in memory, every replica started from the
// oldest again and a lost event behind more slow ones than a run reads
// waited for one replica to win enough periods in a row.
func TestRecoveryResumesOnAnotherReplica(t *testing.T) {
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	shared := outbox.RedisRecovery{Redis: rdb}
	const batch = 1
	r, conn := staleBehindSlow(t, outbox.RecoveryPagesPerRunMax+1, batch)
	r.Resume = shared
	require.NoError(t, r.Run(context.Background()))
	require.Equal(t, "enqueued", status(t, conn, "lost-1"), "one run read more than its page bound")
	ttl, err := rdb.TTL(context.Background(), outbox.RecoveryResumeKey).Result()
	require.NoError(t, err)

	other := &outbox.Recovery{Store: r.Store, Inspector: r.Inspector, Resume: shared, Alerts: noAlerts{}, Log: zerolog.Nop(),
		StaleAfter: r.StaleAfter, MaxAttempts: r.MaxAttempts, BatchMax: batch}
	require.NoError(t, other.Run(context.Background()))
	require.Equal(t, "pending", status(t, conn, "lost-1"), "the other replica started from the oldest again")
	require.Positive(t, ttl, "the resume point is kept for a bounded time")
	n, err := rdb.Exists(context.Background(), outbox.RecoveryResumeKey).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a run that reached the end leaves no resume point")
}

// TestRecoveryStaleResumePointOnlyDelays: a resume point past every stale
// event (left by a run long ago) gives a short page and the run after
// starts from the oldest: the lost event is reached, one run later.
func TestRecoveryStaleResumePointOnlyDelays(t *testing.T) {
	ctx := context.Background()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	shared := outbox.RedisRecovery{Redis: rdb}
	const batch = 3
	r, conn := staleBehindSlow(t, batch, batch)
	r.Resume = shared
	require.NoError(t, shared.SaveResume(ctx, postgres.StaleCursor{UpdatedAt: time.Now(), EventID: "zz"}))
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "enqueued", status(t, conn, "lost-1"))
	require.NoError(t, r.Run(ctx))
	require.Equal(t, "pending", status(t, conn, "lost-1"), "a stale resume point skipped the lost event")
}
