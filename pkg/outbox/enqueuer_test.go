package outbox_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
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

// stopDuringClaim is the scheduler's outbox with SIGTERM arriving while
// the claim's round trip is under way: the claim commits, then the run's
// context ends.
type stopDuringClaim struct {
	db   *postgres.DB
	stop context.CancelFunc
}

func (s stopDuringClaim) ClaimOutbox(ctx context.Context, pendingMax, dueMax, taskMax int) ([]postgres.Claimed, error) {
	claimed, err := s.db.ClaimOutbox(ctx, pendingMax, dueMax, taskMax)
	s.stop()
	return claimed, err
}

// TestStopAfterTheClaimStillEnqueues: a scheduler told to stop between
// the claim's COMMIT and the enqueue must still give the claimed events
// their task; else they sit 'enqueued' with no task in asynq for
// STALE_ENQUEUED_AFTER + RECOVER_INTERVAL, and stale recovery spends one
// of their MAX_RECOVERY_ATTEMPTS on them.
func TestStopAfterTheClaimStillEnqueues(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "sigterm-1", Type: payment.Deposit, UserID: 1,
		Asset: "ETH", Amount: decimal.RequireFromString("1"), TraceID: "t"}})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	e := outbox.NewEnqueuer(outbox.EnqueuerOptions{
		Outbox: stopDuringClaim{db: db, stop: stop}, Client: asynq.NewClientFromRedisClient(rdb), Redis: rdb,
		Log: zerolog.New(io.Discard), PollInterval: time.Second,
	})
	_, _ = e.Once(runCtx)

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var status, taskID string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status, COALESCE(task_id, '') FROM payment_events WHERE event_id = 'sigterm-1'`).Scan(&status, &taskID))
	_, infoErr := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(task.QueuePayments, taskID)
	require.True(t, status == "pending" || infoErr == nil,
		"the stopping scheduler left the event %s under task %q, which asynq does not have (%v)", status, taskID, infoErr)
}

// TestClaimOfAFrozenDatabaseEnds: a PostgreSQL that stops answering
// mid-claim without a reset (a failover, a partition) fails the claim at
// its bound, an outage, instead of holding the enqueuer (wake-ups and
// polls alike, finality re-checks with them) until the kernel gives the
// socket up; the next round goes on once PostgreSQL is back.
func TestClaimOfAFrozenDatabaseEnds(t *testing.T) {
	ctx := context.Background()
	freezer, dsn := testenv.NewFreezer(t, testenv.DatabaseURL(t))
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "freeze-1", Type: payment.Deposit, UserID: 1,
		Asset: "ETH", Amount: decimal.RequireFromString("1"), TraceID: "t"}})
	require.NoError(t, err)

	const bound = 200 * time.Millisecond
	e := outbox.NewEnqueuer(outbox.EnqueuerOptions{
		Outbox: db, Client: asynq.NewClientFromRedisClient(rdb), Redis: rdb,
		Log: zerolog.New(io.Discard), PollInterval: time.Second, ClaimTimeout: bound,
	})
	freezer.Freeze()
	defer freezer.Thaw() // before the pool's Close, which waits for the claim
	done := make(chan error, 1)
	start := time.Now()
	go func() { _, err := e.Once(ctx); done <- err }() // Run's context has no deadline either
	select {
	case err := <-done:
		require.True(t, errors.Is(err, payment.ErrUnavailable), "a claim cut at its bound is an outage, got %v", err)
	case <-time.After(25 * bound):
		t.Fatalf("the claim still waits on a frozen PostgreSQL after %s (its bound is %s)", time.Since(start).Round(time.Millisecond), bound)
	}
	freezer.Thaw()
	_, err = e.Once(ctx)
	require.NoError(t, err)
}
