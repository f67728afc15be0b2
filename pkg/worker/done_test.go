package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

const paymentsActive = "asynq:{payments}:active"

// scriptTrips records, for every round trip, which asynq scripts of the
// payments queue it carried: "dequeue", "done" or "other".
type scriptTrips struct {
	mu    sync.Mutex
	trips [][]string
	shas  map[string]bool // SHAs of the done scripts seen
}

func (s *scriptTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.record([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (s *scriptTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.record(cmds)
		return next(ctx, cmds)
	}
}

func (s *scriptTrips) record(cmds []redis.Cmder) {
	var kinds []string
	for _, c := range cmds {
		args := c.Args()
		if (c.Name() != "evalsha" && c.Name() != "eval") || len(args) < 4 {
			continue
		}
		switch {
		case args[2] == 4 && args[3] == task.PendingListKey(task.QueuePayments):
			kinds = append(kinds, "dequeue")
		case args[2] == 5 && args[3] == paymentsActive:
			kinds = append(kinds, "done")
			if c.Name() == "evalsha" {
				s.mu.Lock()
				if s.shas == nil {
					s.shas = map[string]bool{}
				}
				s.shas[fmt.Sprint(args[1])] = true
				s.mu.Unlock()
			}
		default:
			kinds = append(kinds, "other")
		}
	}
	if len(kinds) == 0 {
		return
	}
	s.mu.Lock()
	s.trips = append(s.trips, kinds)
	s.mu.Unlock()
}

func (s *scriptTrips) snapshot() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]string(nil), s.trips...)
}

func (p *pipeline) activePayments() int64 {
	n, err := p.rdb.LLen(context.Background(), paymentsActive).Result()
	require.NoError(p.t, err)
	return n
}

// TestDoneScriptIsAsynqs: the done script asynq sends is the one the
// waker knows, so its dones are the ones it holds (after an asynq upgrade
// that changed the script, nothing would be held, and this fails).
func TestDoneScriptIsAsynqs(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	raw := &scriptTrips{} // before the waker's hook: asynq's own commands
	p.rdb.AddHook(raw)
	ran := make(chan struct{}, 1)
	wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	_, err := asynq.NewClientFromRedisClient(p.rdb).Enqueue(asynq.NewTask("test:sha", nil), asynq.Queue(task.QueuePayments), asynq.TaskID("sha-1"))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishWakeFor(context.Background(), p.rdb, 1))
	<-ran
	p.waitFor("the done sent", 10*time.Second, func() bool { return p.activePayments() == 0 })
	raw.mu.Lock()
	defer raw.mu.Unlock()
	require.Equal(t, map[string]bool{worker.DoneScriptSHA: true}, raw.shas, "asynq's done script")
}

// TestDoneGoesWithTheNextDequeue: at a trickle, a task's done goes to
// Redis in the round trip of the dequeue the next task's wake-up sets
// off, not in one of its own; every task still ends done in Redis.
func TestDoneGoesWithTheNextDequeue(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan struct{}, 16)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	trips := &scriptTrips{} // inside the waker's hook: what reaches Redis
	p.rdb.AddHook(trips)
	time.Sleep(300 * time.Millisecond) // the processor is waiting
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	const tasks = 8
	for i := range tasks {
		_, err := client.Enqueue(asynq.NewTask("test:done", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("done-%d", i)))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
		select {
		case <-ran:
		case <-time.After(wakeWait):
			t.Fatalf("task %d not run", i)
		}
		time.Sleep(worker.DoneHold / 5) // well inside the hold
	}
	// The last done goes alone, after the hold.
	p.waitFor("every task done in Redis", 10*time.Second, func() bool { return p.activePayments() == 0 })
	for i := range tasks {
		n, err := p.rdb.Exists(ctx, fmt.Sprintf("asynq:{payments}:t:done-%d", i)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "task %d's hash left behind", i)
	}

	dones, alone := 0, 0
	for _, trip := range trips.snapshot() {
		for _, k := range trip {
			if k == "done" {
				dones++
			}
		}
		if strings.Join(trip, ",") == "done" {
			alone++
		}
	}
	require.Equal(t, tasks, dones, "one done per task reached Redis: %v", trips.snapshot())
	// A done of its own only when no dequeue came within the hold: the
	// last, and one a slow run may let slip.
	require.LessOrEqual(t, alone, 2, "dones sent on their own: %v", trips.snapshot())
	require.Zero(t, waker.DonesLost())
}

// TestHeldDonesSurviveAScriptFlush: a done held while Redis loses its
// scripts (a restart, SCRIPT FLUSH) still reaches Redis, sent again with
// the script's source, and the dequeue it goes with still takes the
// next task.
func TestHeldDonesSurviveAScriptFlush(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan struct{}, 2)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	waker.HoldDonesFor(time.Minute) // only a dequeue or the stop sends them
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(p.rdb)
	_, err := client.Enqueue(asynq.NewTask("test:flush", nil), asynq.Queue(task.QueuePayments), asynq.TaskID("flush-1"))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
	<-ran
	p.waitFor("the done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	require.NoError(t, p.rdb.ScriptFlush(ctx).Err())

	_, err = client.Enqueue(asynq.NewTask("test:flush", nil), asynq.Queue(task.QueuePayments), asynq.TaskID("flush-2"))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
	select {
	case <-ran:
	case <-time.After(wakeWait):
		t.Fatal("the task after the flush not run")
	}
	p.waitFor("the second done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	n, err := p.rdb.Exists(ctx, "asynq:{payments}:t:flush-1").Result()
	require.NoError(t, err)
	require.Zero(t, n, "the first task's done, sent with the dequeue after the flush, did not land")
	waker.Stop()
	require.Zero(t, p.activePayments())
	require.Zero(t, waker.DonesLost())
}

// TestStopSendsTheHeldDones: Stop sends what it holds before it returns,
// so a worker that stops leaves no finished task active.
func TestStopSendsTheHeldDones(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan struct{}, 1)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	waker.HoldDonesFor(time.Minute)
	ctx := context.Background()
	_, err := asynq.NewClientFromRedisClient(p.rdb).Enqueue(asynq.NewTask("test:stop", nil), asynq.Queue(task.QueuePayments), asynq.TaskID("stop-1"))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
	<-ran
	p.waitFor("the done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	require.Equal(t, int64(1), p.activePayments(), "the task still active in Redis")
	waker.Stop()
	require.Zero(t, p.activePayments(), "a held done left after Stop")
	require.Zero(t, waker.DonesLost())
}
