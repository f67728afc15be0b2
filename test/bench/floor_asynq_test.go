package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

// With -floor.queue asynq the skeleton's ids travel as settle's do: the
// api hands each new event to its outbox.Handoff (asynq's enqueue script
// and the wake-up, in one round trip), and the worker is an asynq server
// configured as cmd/worker's defaults, with its Waker on the Redis client
// (the wait for a wake-up, the done sent with the next dequeue). What the
// skeleton costs then less what it costs with the plain list is what the
// queue costs a trickle event: the most a plainer queue could save.

// floorAmount is what the skeleton's events carry in their tasks (the
// skeleton's rows keep the webhook's body; the amount is not read back).
var floorAmount = decimal.RequireFromString("1.5")

// floorHandoff pushes through settle's hand-off. A task it cannot enqueue
// is reported on stderr; the benchmark then fails on the events left
// undone.
func floorHandoff(rdb redis.UniversalClient) func(context.Context, string) error {
	h := outbox.NewHandoff(outbox.HandoffOptions{Redis: rdb, Release: floorRelease{}, Log: zerolog.New(os.Stderr)})
	return func(_ context.Context, id string) error {
		if h.Take(1) == 0 {
			return errors.New("the hand-off took no task (queue depth unreadable or at its bound)")
		}
		e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: floorAmount, TraceID: id}
		h.Give([]postgres.Claimed{{Event: e, CreatedAt: time.Now()}})
		return nil
	}
}

type floorRelease struct{}

func (floorRelease) ReleaseHanded(_ context.Context, claimed []postgres.Claimed) (int, error) {
	return 0, fmt.Errorf("skeleton: %d events not enqueued", len(claimed))
}

// Settings as cmd/worker's defaults (WORKER_CONCURRENCY,
// WORKER_POLL_INTERVAL, WORKER_WAKE_WAIT).
const (
	floorConcurrency = 10
	floorPoll        = 20 * time.Millisecond
)

func floorAsynqWorker(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient) error {
	waker := worker.NewWaker(rdb, worker.WakeWaitDefault)
	rdb.AddHook(waker.Hook())
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              floorConcurrency,
		Queues:                   worker.QueueWeights,
		IsFailure:                worker.IsFailure,
		TaskCheckInterval:        floorPoll,
		DelayedTaskCheckInterval: time.Second,
		LogLevel:                 asynq.WarnLevel,
	})
	extra := floorExtra()
	failed := make(chan error, 1)
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		err := floorTask(ctx, pool, t, extra)
		if err != nil {
			select {
			case failed <- err:
			default:
			}
		}
		return err
	}))
	if err != nil {
		return err
	}
	return <-failed
}

func floorTask(ctx context.Context, pool *pgxpool.Pool, t *asynq.Task, extra int) error {
	if t.Type() != task.TypePayment {
		return fmt.Errorf("skeleton: unexpected task %q", t.Type())
	}
	_, events, err := task.DecodePaymentTask(t.Payload())
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, e := range events {
		if err := floorApply(ctx, conn.Conn(), e.ID, extra); err != nil {
			return err
		}
	}
	return nil
}
