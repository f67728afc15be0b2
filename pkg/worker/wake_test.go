package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

// wakeWait is long, so a test that passes did not wait it out.
const wakeWait = 5 * time.Second

// hangGuard bounds a wait for what the code does at once: it fails a
// test that hangs, never one that is slow.
const hangGuard = 30 * time.Second

// wakingServer is an asynq server as the worker runs it: a short
// TaskCheckInterval and the Waker's hook on its Redis client.
func wakingServer(t *testing.T, p *pipeline, handler asynq.Handler) *worker.Waker {
	t.Helper()
	waker, _ := wakingServerOn(t, p.rdb, handler)
	return waker
}

// wakingServerOn is wakingServer on a client of its own.
func wakingServerOn(t *testing.T, rdb redis.UniversalClient, handler asynq.Handler) (*worker.Waker, *asynq.Server) {
	t.Helper()
	waker := worker.NewWaker(rdb, wakeWait)
	rdb.AddHook(waker.Hook())
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: 4, Queues: worker.QueueWeights, TaskCheckInterval: 20 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond },
		ShutdownTimeout:          2 * time.Second, Logger: worker.AsynqLogger{Log: zerolog.New(io.Discard)}, LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(handler))
	// Registered after newPipeline's cleanup, so it runs before it.
	t.Cleanup(func() { waker.Stop(); srv.Shutdown() })
	return waker, srv
}

// unboundedRedis is a client of the pipeline's Redis without a read
// deadline, so a wait runs its whole aligned length (2.5 to 7.5 s at
// wakeWait). On redisconn's client a wait is cut to 1.5 s (its 2 s read
// timeout less the waker's margin), and a missed wake-up costs hardly
// more than a slow run on a loaded machine.
func unboundedRedis(t *testing.T, p *pipeline) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(p.redisURL)
	require.NoError(t, err)
	opts.ReadTimeout = -1
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestIdleWorkerWaitsForTheEnqueuersWakeUp: an idle worker asks Redis
// about once per wait instead of every TaskCheckInterval, and an event
// the enqueuer hands over is taken when its wake-up ends the wait, not
// left to the poll.
func TestIdleWorkerWaitsForTheEnqueuersWakeUp(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true})
	batcher := worker.NewBatcher(p.db, postgres.LedgerOptions{}, 32, 1, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go batcher.Run(ctx)
	handler := worker.NewWorker(worker.WorkerOptions{Log: zerolog.New(io.Discard), Batcher: batcher, DeadLetters: p.sink, Alerts: p.alerts})
	waker, _ := wakingServerOn(t, unboundedRedis(t, p), handler)
	p.user(1, nil)

	waitingAll(t, p, waker)
	before := waker.Waits()
	time.Sleep(time.Second)
	// Polling every 10–30 ms would be 30 or more looks.
	require.LessOrEqual(t, waker.Waits()-before, int64(2), "an idle worker kept polling")
	require.Positive(t, waker.Waits(), "the hook never saw asynq's dequeue (asynq's keys changed?)")

	// Each event is proof when no wait ran out between its hand-over and
	// its confirmation: an idle worker looks only after a wait, so a wait
	// a wake-up ended took it. One a wait ran out in may have been found
	// by the poll (a wait runs out every 5 s; the round takes tens of
	// ms), so it proves nothing and another event is sent; broken, the
	// wake-up leaves every event to the poll.
	const proofs, unprovenMax = 3, 3
	proven, unproven := 0, 0
	for i := 0; proven < proofs; i++ {
		id := fmt.Sprintf("wake-%d", i)
		before := waker.Counts()
		p.accept(id, payment.Deposit, 1, "ETH", "1")
		p.waitFor(id+" confirmed", hangGuard, func() bool {
			return p.count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'confirmed'`, id) == 1
		})
		after := waker.Counts()
		if after.RanOut > before.RanOut {
			unproven++
			require.Less(t, unproven, unprovenMax, "%d events were taken only after a wait ran out (the enqueuer's wake-up ended none): %+v then %+v", unproven, before, after)
			continue
		}
		require.Greater(t, after.Woken, before.Woken, "%s confirmed with no wait run out and none woken: the worker looked without waiting", id)
		proven++
		time.Sleep(200 * time.Millisecond)
	}
	p.requireInvariants()
}

// TestForwardedRetryWakesTheWorker: a retry moved into the queue by
// asynq's forwarder comes without a published wake-up; the hook sees the
// move and the retry is taken at once, not left to the poll.
func TestForwardedRetryWakesTheWorker(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	var failed sync.Map // task IDs whose first run failed
	retried := make(chan string, 4)
	waker, _ := wakingServerOn(t, unboundedRedis(t, p), asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if _, again := failed.LoadOrStore(id, true); !again {
			return errors.New("once")
		}
		retried <- id
		return nil
	}))
	waitingAll(t, p, waker)
	client := asynq.NewClientFromRedisClient(p.rdb)
	// A retry is proof when no wait ran out between its task's enqueue
	// and its run: after the failure an idle worker looks only after a
	// wait, and only the hook's booking of the forward (the tasks it
	// announces, its own wake-up) ends one. The enqueue, failure and
	// retry take ~100 ms (forwarder tick 100 ms, retry delay 10 ms), a
	// wait runs out every 5 s: a task during which one did proves
	// nothing and another is sent. Broken, every retry waits for the
	// wait begun after its failure to run out.
	provenRetry(t, p, waker, "the forward woke no wait", func(i int) worker.WakeCounts {
		id := fmt.Sprintf("retry-%d", i)
		before := waker.Counts()
		_, err := client.Enqueue(asynq.NewTask("test:retry", nil), asynq.Queue(task.QueuePayments), asynq.MaxRetry(3), asynq.TaskID(id))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishWake(context.Background(), p.rdb))
		select {
		case got := <-retried:
			require.Equal(t, id, got)
		case <-time.After(hangGuard):
			t.Fatalf("%s: no retry", id)
		}
		return before
	}, func(before, after worker.WakeCounts) bool { return after.RanOut > before.RanOut })
}

// provenRetry sends retries until one is taken with no wait run out
// while it was (ranOut false), then waits for the forward's own wake-up
// to be popped: it ends the wait it finds, or is left for the next one.
// A retry during which a wait ran out proves nothing; the third such
// fails, saying what the forward did not do.
func provenRetry(t *testing.T, p *pipeline, waker *worker.Waker, failure string, retry func(i int) (before worker.WakeCounts), ranOut func(before, after worker.WakeCounts) bool) {
	t.Helper()
	const unprovenMax = 3
	for i, unproven := 0, 0; ; i++ {
		before := retry(i)
		after := waker.Counts()
		if !ranOut(before, after) {
			p.waitFor("the forward's own wake-up popped", hangGuard, func() bool { return waker.Counts().WokenOwn > before.WokenOwn })
			return
		}
		unproven++
		require.Less(t, unproven, unprovenMax, "%d retries were taken only after a wait ran out (%s): %+v then %+v", unproven, failure, before, after)
	}
}
