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
// payments queue it carried ("dequeue", "done", "done-again" or "other"), and the SHAs
// of the done scripts sent by SHA.
type scriptTrips struct {
	roundTrips
	mu   sync.Mutex
	shas map[string]bool
}

func newScriptTrips() *scriptTrips {
	s := &scriptTrips{shas: map[string]bool{}}
	s.kind = s.script
	return s
}

func (s *scriptTrips) script(c redis.Cmder) string {
	args := c.Args()
	if (c.Name() != "evalsha" && c.Name() != "eval") || len(args) < 4 {
		return ""
	}
	switch {
	case args[2] == 4 && args[3] == task.PendingListKey(task.QueuePayments):
		return "dequeue"
	case args[2] == 5 && args[3] == paymentsActive && c.Name() == "eval":
		// Sent again with the source after NOSCRIPT (the first done
		// held in a Redis that has not loaded the script yet).
		return "done-again"
	case args[2] == 5 && args[3] == paymentsActive:
		s.mu.Lock()
		s.shas[fmt.Sprint(args[1])] = true
		s.mu.Unlock()
		return "done"
	}
	return "other"
}

// signallingServer starts a waking server whose handler signals ran
// and succeeds; hooks are hooks to add before the waker's.
func signallingServer(t *testing.T, hooks ...redis.Hook) (*pipeline, *worker.Waker, <-chan struct{}) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	for _, h := range hooks {
		p.rdb.AddHook(h)
	}
	ran := make(chan struct{}, 16)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		// Finish after the processor's next dequeue has begun its wait,
		// so the done is held for the dequeue after it (one that finished
		// first would ride in that wait's round trip).
		time.Sleep(50 * time.Millisecond)
		return nil
	}))
	// The processor has found the queue empty and waits: a task
	// enqueued during its first look is taken unannounced, and the look
	// right after it, made at once, would carry a done held by then.
	// (Waited for, not slept for: a loaded machine can be slower.)
	waitingAll(t, p, waker)
	return p, waker, ran
}

// runTask enqueues a payments task with its wake-up and waits until the
// handler has signalled ran.
func runTask(t *testing.T, p *pipeline, id string, ran <-chan struct{}) {
	t.Helper()
	_, err := asynq.NewClientFromRedisClient(p.rdb).Enqueue(asynq.NewTask("test:done", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(id))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishWakeFor(context.Background(), p.rdb, 1))
	select {
	case <-ran:
	case <-time.After(wakeWait):
		t.Fatalf("task %s not run", id)
	}
}

func (p *pipeline) activePayments() int64 {
	n, err := p.rdb.LLen(context.Background(), paymentsActive).Result()
	require.NoError(p.t, err)
	return n
}

func (p *pipeline) taskGone(id string) bool {
	n, err := p.rdb.Exists(context.Background(), "asynq:{payments}:t:"+id).Result()
	require.NoError(p.t, err)
	return n == 0
}

// TestDoneScriptIsAsynqs: the done script asynq sends is the one the
// waker knows, so its dones are the ones it holds (after an asynq upgrade
// that changed the script, nothing would be held, and this fails).
func TestDoneScriptIsAsynqs(t *testing.T) {
	raw := newScriptTrips() // before the waker's hook: asynq's own commands
	p, _, ran := signallingServer(t, raw)
	runTask(t, p, "sha-1", ran)
	p.waitFor("the done sent", 10*time.Second, func() bool { return p.activePayments() == 0 })
	raw.mu.Lock()
	defer raw.mu.Unlock()
	require.Equal(t, map[string]bool{worker.DoneScriptSHA: true}, raw.shas, "asynq's done script")
}

// TestDoneGoesWithTheNextDequeue: at a trickle, a task's done goes to
// Redis in the round trip of the dequeue the next task's wake-up sets
// off, not in one of its own; every task still ends done in Redis.
func TestDoneGoesWithTheNextDequeue(t *testing.T) {
	p, waker, ran := signallingServer(t)
	trips := newScriptTrips() // inside the waker's hook: what reaches Redis
	p.rdb.AddHook(trips)
	const tasks = 8
	for i := range tasks {
		runTask(t, p, fmt.Sprintf("done-%d", i), ran)
		time.Sleep(worker.DoneHold / 5) // well inside the hold
	}
	// The last done goes alone, after the hold.
	p.waitFor("every task done in Redis", 10*time.Second, func() bool { return p.activePayments() == 0 })
	for i := range tasks {
		require.True(t, p.taskGone(fmt.Sprintf("done-%d", i)), "task %d's hash left behind", i)
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
	p, waker, ran := signallingServer(t)
	waker.HoldDonesFor(time.Minute) // only a dequeue or the stop sends them
	runTask(t, p, "flush-1", ran)
	p.waitFor("the done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	require.NoError(t, p.rdb.ScriptFlush(context.Background()).Err())

	runTask(t, p, "flush-2", ran)
	p.waitFor("the second done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	require.True(t, p.taskGone("flush-1"), "the first task's done, sent with the dequeue after the flush, did not land")
	waker.Stop()
	active, err := p.rdb.LRange(context.Background(), paymentsActive, 0, -1).Result()
	require.NoError(t, err)
	require.Empty(t, active, "tasks left active after Stop (held %d, lost %d)", waker.HeldDones(), waker.DonesLost())
	require.Zero(t, waker.DonesLost())
}

// TestStopSendsTheHeldDones: Stop sends what it holds before it returns,
// so a worker that stops leaves no finished task active.
func TestStopSendsTheHeldDones(t *testing.T) {
	p, waker, ran := signallingServer(t)
	waker.HoldDonesFor(time.Minute)
	runTask(t, p, "stop-1", ran)
	p.waitFor("the done held", 5*time.Second, func() bool { return waker.HeldDones() == 1 })
	require.Equal(t, int64(1), p.activePayments(), "the task still active in Redis")
	waker.Stop()
	require.Zero(t, p.activePayments(), "a held done left after Stop")
	require.Zero(t, waker.DonesLost())
}
