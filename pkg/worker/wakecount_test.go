package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/task"
)

// lookCounter counts the dequeue scripts of the payments queue that reach
// Redis (it sits inside the waker's hook, so it sees real looks only).
type lookCounter struct{ n atomic.Int64 }

func (l *lookCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *lookCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l *lookCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[2] == 4 && args[3] == task.PendingListKey(task.QueuePayments) {
			l.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// TestAnnouncedWakeUpsCostOneLookPerTask: tasks that come one at a time,
// each announced by its wake-up, are taken with one look each (before,
// every task cost a second, empty look), and still at once.
func TestAnnouncedWakeUpsCostOneLookPerTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 16)
	wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	looks := &lookCounter{}
	p.rdb.AddHook(looks)
	time.Sleep(300 * time.Millisecond) // the processor is now waiting
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	const tasks = 10
	started := time.Now()
	before := looks.n.Load()
	for i := range tasks {
		sent := time.Now()
		_, err := client.Enqueue(asynq.NewTask("test:one", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("one-%d", i)))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
		select {
		case at := <-ran:
			require.Less(t, at.Sub(sent), time.Second, "task %d waited for the worker's poll", i)
		case <-time.After(wakeWait):
			t.Fatalf("task %d not run", i)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// One look per task, and an idle look per wait at most.
	idle := int64(time.Since(started)/wakeWait) + 1
	require.LessOrEqual(t, looks.n.Load()-before, int64(tasks)+idle, "looks per task")
}

// TestShortAnnouncementLosesNoTask: three tasks announced as one, and
// three with an unsaid count: every one runs, the unannounced ones within
// the wait.
func TestShortAnnouncementLosesNoTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	var runs atomic.Int32
	wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		runs.Add(1)
		return nil
	}))
	time.Sleep(300 * time.Millisecond)
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	for round, publish := range []func() error{
		func() error { return outbox.PublishWakeFor(ctx, p.rdb, 1) },
		func() error { return outbox.PublishWake(ctx, p.rdb) },
	} {
		for i := range 3 {
			_, err := client.Enqueue(asynq.NewTask("test:short", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("short-%d-%d", round, i)))
			require.NoError(t, err)
		}
		started := time.Now()
		require.NoError(t, publish())
		want := int32(3 * (round + 1))
		p.waitFor("every task run", 2*wakeWait, func() bool { return runs.Load() == want })
		require.Less(t, time.Since(started), wakeWait+time.Second, "round %d: a task waited more than the wait", round)
	}
}
