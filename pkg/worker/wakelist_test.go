package worker_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

// waitingAll returns once every waker's processor has begun a wait.
func waitingAll(t *testing.T, p *pipeline, wakers ...*worker.Waker) {
	t.Helper()
	p.waitFor("the processors waiting", wakeWait, func() bool {
		for _, w := range wakers {
			if w.Waits() == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(50 * time.Millisecond) // the BLPOPs reach Redis
}

// TestOneWaitingWorkerWakesPerTask: of two idle workers, only the one
// that pops a task's wake-up looks for it, at once; the other sleeps on
// (a broadcast woke both, and one of them looked in vain every time).
func TestOneWaitingWorkerWakesPerTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 32)
	handler := asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	})
	looks := []*lookCounter{countLooks(task.QueuePayments), countLooks(task.QueuePayments)}
	var wakers []*worker.Waker
	for _, l := range looks {
		rdb := unboundedRedis(t, p) // whole waits: fewer run out during trickle
		waker, _ := wakingServerOn(t, rdb, handler)
		rdb.AddHook(l) // inside the waker's hook: real looks only
		wakers = append(wakers, waker)
	}
	waitingAll(t, p, wakers...)
	const tasks = 10
	counts := []worker.WakeCounts{wakers[0].Counts(), wakers[1].Counts()}
	before := looks[0].n.Load() + looks[1].n.Load()
	sent := trickle(t, p, "one", tasks, ran, wakers...)
	looked := looks[0].n.Load() + looks[1].n.Load() - before
	// A wake-up that woke both would cost a look in vain per task.
	require.LessOrEqual(t, looked, lookAllowance(sent, counts, wakers...), "looks for %d tasks by two workers", sent)
}

// TestWakeUpAndDequeueShareARoundTrip: a waiting worker's BLPOP of the
// wake-ups goes in front of its dequeue in one pipeline, so a task that
// comes with its wake-up is dequeued in the round trip that was waiting
// for it.
func TestWakeUpAndDequeueShareARoundTrip(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 16)
	rdb := unboundedRedis(t, p) // whole waits: fewer run out during trickle
	waker, _ := wakingServerOn(t, rdb, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	takes := &takenIn{}
	rdb.AddHook(takes)
	waitingAll(t, p, waker)
	const tasks = 5
	sent := trickle(t, p, "trip", tasks, ran, waker)
	got := takes.snapshot()
	require.Len(t, got, sent, "round trips that took a task: %v", got)
	for _, trip := range got {
		require.GreaterOrEqual(t, len(trip), 2, "%v", got)
		require.Equal(t, []string{"blpop", "evalsha"}, trip[len(trip)-2:], "a task taken without the wait in front of it: %v", got)
	}
}

// takenIn records the commands of each round trip that dequeued a
// payments task (it sits inside the waker's hook: what reaches Redis).
type takenIn struct {
	mu    sync.Mutex
	trips [][]string
}

func (h *takenIn) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *takenIn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.record([]redis.Cmder{cmd})
		return err
	}
}
func (h *takenIn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.record(cmds)
		return err
	}
}

func (h *takenIn) record(cmds []redis.Cmder) {
	var names []string
	took := false
	for _, c := range cmds {
		names = append(names, c.Name())
		args := c.Args()
		if c.Name() == "evalsha" && len(args) > 3 && args[2] == 4 && args[3] == task.PendingListKey(task.QueuePayments) {
			if d, ok := c.(*redis.Cmd); ok && d.Err() == nil && d.Val() != nil {
				took = true // a task's message, not an empty answer
			}
		}
	}
	if took {
		h.mu.Lock()
		h.trips = append(h.trips, names)
		h.mu.Unlock()
	}
}

func (h *takenIn) snapshot() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][]string(nil), h.trips...)
}

// TestStopEndsAWaitUnderWay: a worker stopping while its dequeue waits
// for a wake-up (5 to 15 s here: the longest wait, on a client without a
// read deadline) shuts down at once: Stop leaves a wake-up on the
// waker's own list, and that, not the wait running out, ends the wait.
func TestStopEndsAWaitUnderWay(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	// Stop comes as a wait begins, at least 5 s before it can run out;
	// if one ran out all the same (the test stalled for seconds), Stop
	// may have met no wait, which proves nothing: another worker stops.
	// Broken, every stop waits for its wait to run out.
	const unprovenMax = 3
	for unproven := 0; ; {
		before, after := stopWhileWaiting(t, p)
		if after.RanOut == before.RanOut {
			require.Equal(t, before.WokenOwn+1, after.WokenOwn, "the stop's own wake-up ended no wait: %+v then %+v", before, after)
			return
		}
		unproven++
		require.Less(t, unproven, unprovenMax, "%d stops waited for their wait to run out: %+v then %+v", unproven, before, after)
	}
}

// stopWhileWaiting starts a worker, stops it while its dequeue waits,
// and returns its waker's counts as it began to stop and once stopped.
func stopWhileWaiting(t *testing.T, p *pipeline) (before, after worker.WakeCounts) {
	t.Helper()
	rdb := unboundedRedis(t, p)
	waker := worker.NewWaker(rdb, worker.WakeWaitMax)
	rdb.AddHook(waker.Hook())
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: 1, Queues: worker.QueueWeights, TaskCheckInterval: 20 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second, Logger: worker.AsynqLogger{Log: zerolog.New(io.Discard)}, LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
	waitingAll(t, p, waker)
	before = waker.Counts()
	waker.Stop()
	srv.Shutdown()
	return before, waker.Counts()
}

// TestWakeListIsBounded: wake-ups left while no worker waits are trimmed
// to the newest task.WakeListMax; none is left for no task.
func TestWakeListIsBounded(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ctx := context.Background()
	require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 0))
	n, err := p.rdb.LLen(ctx, task.WakeList).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a wake-up for no task")
	for range 3 {
		require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, task.WakeListMax/2+7))
	}
	require.NoError(t, outbox.PublishWake(ctx, p.rdb))
	n, err = p.rdb.LLen(ctx, task.WakeList).Result()
	require.NoError(t, err)
	require.Equal(t, int64(task.WakeListMax), n)
	last, err := p.rdb.LIndex(ctx, task.WakeList, -1).Result()
	require.NoError(t, err)
	require.Empty(t, last, "the newest wake-up (one without a count) kept")
}

// refusedWaits makes Redis refuse every wait's BLPOP, as a Redis before
// 6.0 refuses its fractional timeout.
type refusedWaits struct{ refused atomic.Int64 }

func (r *refusedWaits) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *refusedWaits) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (r *refusedWaits) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "blpop" {
				args := c.Args()
				args[len(args)-1] = "not-a-timeout"
				r.refused.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestRefusedWaitLosesNoTask: when Redis refuses the wait, the dequeue
// behind it still runs, and a task with or without a wake-up is taken at
// once (the worker polls instead of waiting).
func TestRefusedWaitLosesNoTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 16)
	rdb := unboundedRedis(t, p) // a wait that blocked would run 2.5 to 7.5 s
	waker, _ := wakingServerOn(t, rdb, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	refused := &refusedWaits{}
	rdb.AddHook(refused)
	trips := &tripLog{}
	rdb.AddHook(trips)
	p.waitFor("a wait refused", hangGuard, func() bool { return refused.refused.Load() > 0 })
	trickle(t, p, "refused", 3, ran)
	// Two more refused waits: the worker is past the looks that follow
	// a take, in the waits of an idle worker.
	idle := refused.refused.Load()
	p.waitFor("the worker waiting again", hangGuard, func() bool { return refused.refused.Load() >= idle+2 })
	from := trips.len()
	_, err := asynq.NewClientFromRedisClient(p.rdb).Enqueue(asynq.NewTask("test:unannounced", nil), asynq.Queue(task.QueuePayments))
	require.NoError(t, err)
	select {
	case <-ran:
	case <-time.After(hangGuard):
		t.Fatal("the unannounced task did not run")
	}
	// An idle worker looks only behind a wait: the task was taken by the
	// look in the round trip of a refused one.
	var took []trip
	for _, tr := range trips.since(from) {
		if tr.took {
			took = append(took, tr)
		}
	}
	require.Equal(t, []trip{{wait: waitRefused, took: true}}, took, "the unannounced task's take")
	// No wait blocked: none ran out, none was woken.
	c := waker.Counts()
	require.Zero(t, c.RanOut+c.Woken+c.WokenOwn, "a wait was not refused: %+v", c)
}
