package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/worker"
)

// lookCounter counts the dequeue scripts of its queues that reach Redis
// (it sits inside the waker's hook, so it sees real looks only; a look
// that carries held dones goes as a pipeline).
type lookCounter struct {
	n      atomic.Int64
	queues []string
}

func countLooks(queues ...string) *lookCounter { return &lookCounter{queues: queues} }

func (l *lookCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *lookCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			l.count(cmd)
		}
		return next(ctx, cmds)
	}
}
func (l *lookCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.count(cmd)
		return next(ctx, cmd)
	}
}

func (l *lookCounter) count(cmd redis.Cmder) {
	args := cmd.Args()
	if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[2] == 4 {
		for _, q := range l.queues {
			if args[3] == task.PendingListKey(q) {
				l.n.Add(1)
			}
		}
	}
}

// TestAnnouncedWakeUpsCostOneLookPerTask: tasks that come one at a time,
// each announced by its wake-up, are taken with one look each (before,
// every task cost a second, empty look), and still at once.
func TestAnnouncedWakeUpsCostOneLookPerTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 16)
	rdb := unboundedRedis(t, p) // whole waits: fewer run out during trickle
	waker, _ := wakingServerOn(t, rdb, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	looks := countLooks(task.QueuePayments)
	rdb.AddHook(looks)
	waitingAll(t, p, waker)
	const tasks = 10
	counts := waker.Counts()
	before := looks.n.Load()
	sent := trickle(t, p, "one", tasks, ran, waker)
	looked := looks.n.Load() - before
	require.LessOrEqual(t, looked, lookAllowance(sent, []worker.WakeCounts{counts}, waker), "looks for %d tasks", sent)
}

// lookAllowance is the most looks at the payments queue that tasks
// announced one at a time may cost the wakers' workers since their
// counts were from: one per task and per wait that ran out; two more
// per task a look took before its wake-up came (a run-out's look found
// it between its enqueue and its wake-up: the look after it, which does
// not wait, and the wake-up's own, which finds nothing); and each
// worker's look still under way. Looks are counted as they are sent,
// waits as they end: take from before the looks' first count, and call
// this after their last.
func lookAllowance(tasks int, from []worker.WakeCounts, wakers ...*worker.Waker) int64 {
	allowed := int64(tasks)
	for i, w := range wakers {
		to := w.Counts()
		allowed += (to.RanOut - from[i].RanOut) + 2*(to.Unannounced-from[i].Unannounced) + 1
	}
	return allowed
}

// trickle enqueues payments tasks one at a time, each with its wake-up,
// 100 ms apart, until tasks of them have shown that a wake-up, not the
// poll, took them to the wakers' workers, and returns how many it sent.
// A task is proof when no wait ran out between its enqueue and its run:
// an idle worker looks only after a wait, so a wait a wake-up ended took
// it. One a wait ran out in (a wait runs out every 5 s, a task takes
// tens of ms) may have been found by the poll and proves nothing;
// broken, the wake-up leaves every task to the poll. With no wakers it
// only requires each task to run.
func trickle(t *testing.T, p *pipeline, prefix string, tasks int, ran <-chan time.Time, wakers ...*worker.Waker) (sent int) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	const unprovenMax = 3
	unproven := 0
	for ; sent-unproven < tasks; sent++ {
		before := sumCounts(wakers)
		_, err := client.Enqueue(asynq.NewTask("test:"+prefix, nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("%s-%d", prefix, sent)))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
		select {
		case <-ran:
		case <-time.After(hangGuard):
			t.Fatalf("task %d not run", sent)
		}
		after := sumCounts(wakers)
		switch {
		case len(wakers) == 0:
		case after.RanOut > before.RanOut:
			unproven++
			require.Less(t, unproven, unprovenMax, "%d tasks were taken only after a wait ran out (their wake-ups ended none): %+v then %+v", unproven, before, after)
		default:
			require.Greater(t, after.Woken, before.Woken, "task %d ran with no wait run out and none woken: a worker looked without waiting", sent)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sent
}

// sumCounts is the wakers' counts summed.
func sumCounts(wakers []*worker.Waker) worker.WakeCounts {
	var sum worker.WakeCounts
	for _, w := range wakers {
		c := w.Counts()
		sum.RanOut += c.RanOut
		sum.Woken += c.Woken
		sum.WokenOwn += c.WokenOwn
		sum.Unannounced += c.Unannounced
		sum.QuietRanOut += c.QuietRanOut
	}
	return sum
}

// TestShortAnnouncementLosesNoTask: three tasks announced as one, and
// three with an unsaid count: every one runs, the unannounced ones within
// the longest wait and together, not a wait each.
func TestShortAnnouncementLosesNoTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 8)
	// Whole waits: on p.rdb a wait is cut to 1.5 s, and a task that
	// waited a wait of its own still came well within the bounds.
	waker, _ := wakingServerOn(t, unboundedRedis(t, p), asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	waitingAll(t, p, waker)
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
		var at []time.Time
		for i := range 3 {
			select {
			case r := <-ran:
				at = append(at, r)
			case <-time.After(3 * wakeWait):
				t.Fatalf("round %d: task %d not run", round, i)
			}
		}
		slices.SortFunc(at, time.Time.Compare)
		// A task found that nobody announced makes the worker look again
		// at once; had it waited first, the third task would come a
		// whole wait (5 s: waits end on multiples of it) after the second.
		require.Less(t, at[2].Sub(at[1]), 2*time.Second, "round %d: an unannounced task waited a wait of its own", round)
		// The unannounced tasks come after the wait under way: at most
		// the longest wait, and a run of tens of ms.
		require.Less(t, at[2].Sub(started), longestWait+2*time.Second, "round %d: a task waited more than the longest wait", round)
	}
}

// TestQuietQueuesAreAskedOncePerWait: at a trickle of payment tasks the
// notifications and maintenance queues, found empty, are asked about
// again only when their quiet mark runs out (QuietWaits waits), not on
// every dequeue (asynq draws the queues' order by weight, so before,
// 0.4 empty looks per task).
func TestQuietQueuesAreAskedOncePerWait(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan struct{}, 64)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	looks := countLooks(task.QueueNotifications, task.QueueMaintenance)
	p.rdb.AddHook(looks)
	p.waitFor("both quiet queues found empty", hangGuard, func() bool {
		return waker.Quiet(task.QueueNotifications) && waker.Quiet(task.QueueMaintenance)
	})
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	const tasks = 40
	counts := waker.Counts()
	before := looks.n.Load()
	for i := range tasks {
		_, err := client.Enqueue(asynq.NewTask("test:quiet", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("quiet-%d", i)))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishWakeFor(ctx, p.rdb, 1))
		select {
		case <-ran:
		case <-time.After(wakeWait):
			t.Fatalf("task %d not run", i)
		}
		time.Sleep(20 * time.Millisecond)
	}
	looked := looks.n.Load() - before
	// A look at a quiet queue is one whose mark ran out, booked as it
	// is decided, before it is sent: one decided as the count began may
	// be counted in looked alone.
	ranOut := waker.Counts().QuietRanOut - counts.QuietRanOut
	require.LessOrEqual(t, looked, ranOut+1, "looks at the quiet queues for %d tasks", tasks)
	require.Positive(t, waker.Skipped())
}

// TestQuietQueuesStillRunTheirTasks: a task enqueued without a wake-up
// into a queue found empty runs within the quiet mark's time and one wait
// (of the payments queue, which asynq's drawn order may put before it: as
// before quiet marks, when a round's payments wait could come first too).
func TestQuietQueuesStillRunTheirTasks(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	type run struct {
		id string
		at time.Time
	}
	ran := make(chan run, 16)
	wakingServer(t, p, asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		ran <- run{id, time.Now()}
		return nil
	}))
	time.Sleep(300 * time.Millisecond) // both quiet queues have been looked at, empty
	client := asynq.NewClientFromRedisClient(p.rdb)
	for _, q := range []string{task.QueueNotifications, task.QueueMaintenance} {
		sent := time.Now()
		_, err := client.Enqueue(asynq.NewTask("test:"+q, nil), asynq.Queue(q), asynq.TaskID("plain-"+q))
		require.NoError(t, err)
		select {
		case r := <-ran:
			require.Equal(t, "plain-"+q, r.id)
			limit := min(worker.QuietWaits*wakeWait, worker.WakeWaitMax) + longestWait + time.Second
			require.Less(t, r.at.Sub(sent), limit, "%s task waited beyond the quiet mark and a wait", q)
		case <-time.After(5 * wakeWait):
			t.Fatalf("%s task not run", q)
		}
	}
}

// TestForwardedRetryEndsTheQuietMark: a retry the forwarder moves into a
// queue found empty runs at its due time, not after the quiet mark or the
// payments wait the processor is in.
func TestForwardedRetryEndsTheQuietMark(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	type run struct {
		id string
		at time.Time
	}
	ran := make(chan run, 16)
	var failed atomic.Bool
	// Whole waits: on p.rdb a wait is cut to 1.5 s, and a forward
	// that left the payments wait to run out cost ~1.5 s, under the bound.
	waker, _ := wakingServerOn(t, unboundedRedis(t, p), asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if failed.CompareAndSwap(false, true) {
			ran <- run{id + "-failed", time.Now()}
			return fmt.Errorf("once")
		}
		ran <- run{id, time.Now()}
		return nil
	}))
	waitingAll(t, p, waker)
	ctx := context.Background()
	_, err := asynq.NewClientFromRedisClient(p.rdb).Enqueue(asynq.NewTask("test:retried", nil), asynq.Queue(task.QueueMaintenance), asynq.TaskID("retried"), asynq.MaxRetry(3))
	require.NoError(t, err)
	require.NoError(t, outbox.PublishQueueWake(ctx, p.rdb, task.QueueMaintenance))
	var failedAt time.Time
	for _, want := range []string{"retried-failed", "retried"} {
		select {
		case r := <-ran:
			require.Equal(t, want, r.id)
			if want == "retried-failed" {
				failedAt = r.at
				continue
			}
			// Due 10 ms after the failure, forwarded within the
			// forwarder's 100 ms. Missed, the forward costs the quiet
			// mark (10 s) or the payments wait begun as the first run
			// was taken (at least 2.5 s); a run takes tens of ms.
			require.Less(t, r.at.Sub(failedAt), 2*time.Second, "the retry waited for the quiet queue's wait")
		case <-time.After(3 * wakeWait):
			t.Fatalf("%s not seen", want)
		}
	}
}

// forwardCounter counts asynq's forward scripts that reach Redis (it
// sits inside the waker's hook, like lookCounter).
type forwardCounter struct{ n atomic.Int64 }

func (f *forwardCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *forwardCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *forwardCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 4 && args[2] == 2 {
			if to, _ := args[4].(string); len(to) > 9 && to[len(to)-9:] == "}:pending" {
				f.n.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}

// TestForwarderAsksOncePerRound: with nothing due, the forwarder's six
// scripts a round (retry and scheduled of three queues) become one
// pipelined question; scheduled tasks still move at their time, and a
// crowd of them (more than a script moves at once) all of them.
func TestForwarderAsksOncePerRound(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan string, 512)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		ran <- id
		return nil
	}))
	forwards := &forwardCounter{}
	p.rdb.AddHook(forwards)
	time.Sleep(500 * time.Millisecond) // every set has been seen once
	scripts, plans, answered := forwards.n.Load(), waker.ForwardPlans(), waker.ForwardsAnswered()
	// Five rounds (half a second at the server's 100 ms), waited for
	// rather than timed: a loaded machine runs fewer in a given second.
	require.Eventually(t, func() bool { return waker.ForwardPlans()-plans >= 5 }, 30*time.Second, 20*time.Millisecond, "the plan asked fewer than 5 times")
	rounds := waker.ForwardPlans() - plans
	require.Zero(t, forwards.n.Load()-scripts, "forward scripts reached Redis with nothing due")
	// Each round's six scripts, answered here (the last round may be
	// under way).
	require.GreaterOrEqual(t, waker.ForwardsAnswered()-answered, 6*(rounds-1))

	client := asynq.NewClientFromRedisClient(p.rdb)
	const crowd = 250
	// asynq dates a scheduled task to the second (its score is the unix
	// second), and enqueues one whose time has passed straight into the
	// pending list, without the forwarder or a wake-up: the time is on a
	// second, with at least a second to enqueue the crowd before it.
	due := time.Now().Truncate(time.Second).Add(2 * time.Second)
	for i := range crowd {
		q := task.QueuePayments
		if i%5 == 0 {
			q = task.QueueNotifications
		}
		info, err := client.Enqueue(asynq.NewTask("test:later", nil), asynq.Queue(q), asynq.TaskID(fmt.Sprintf("later-%d", i)), asynq.ProcessAt(due))
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, info.State, "task %d enqueued after its time (the crowd took over a second)", i)
	}
	seen := map[string]bool{}
	// Generous for a loaded machine, yet short of what a missed forward
	// costs: a quiet queue's mark (10 s) or the payments wait (up to 7.5 s).
	const within = 6 * time.Second
	deadline := time.After(time.Until(due) + within)
	for len(seen) < crowd {
		select {
		case id := <-ran:
			require.False(t, time.Now().Before(due), "%s ran before its time", id)
			seen[id] = true
		case <-deadline:
			t.Fatalf("%d of %d scheduled tasks ran within %v of their time", len(seen), crowd, within)
		}
	}
	require.Positive(t, forwards.n.Load()-scripts, "the due tasks moved without the real script?")
}

// TestQueueWakeUpEndsTheQuietMark: a task on a queue found empty, with
// the scheduler's wake-up that names the queue, runs at once, not after
// the quiet mark's seconds; a wake-up naming an unknown queue is read as
// one without a count (the payments queue is looked at, nothing breaks).
func TestQueueWakeUpEndsTheQuietMark(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan string, 16)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		ran <- id
		return nil
	}))
	looks := countLooks(task.QueueNotifications, task.QueueMaintenance)
	p.rdb.AddHook(looks)
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	require.NoError(t, outbox.PublishQueueWake(ctx, p.rdb, "no-such-queue"))
	// A task is proof when no quiet mark ran out between its wake-up
	// and its run: its queue's mark (10 s here) was in force when it was
	// sent, so the wake-up ended it. A mark runs out every 10 s per
	// queue, the other queue's too; a task during which one did proves
	// nothing and another is sent. Broken, every task waits for its
	// queue's mark to run out.
	const unprovenMax = 3
	unproven := 0
	for i, q := range []string{task.QueueNotifications, task.QueueMaintenance, task.QueueNotifications} {
		for try := 0; ; try++ {
			p.waitFor(q+" found empty", hangGuard, func() bool { return waker.Quiet(q) })
			id := fmt.Sprintf("woken-%d-%d", i, try)
			before, looked := waker.Counts(), looks.n.Load()
			_, err := client.Enqueue(asynq.NewTask("test:"+q, nil), asynq.Queue(q), asynq.TaskID(id))
			require.NoError(t, err)
			require.NoError(t, outbox.PublishQueueWake(ctx, p.rdb, q))
			select {
			case got := <-ran:
				require.Equal(t, id, got)
			case <-time.After(hangGuard):
				t.Fatalf("%s task not run", q)
			}
			require.Positive(t, looks.n.Load()-looked, "ran without a look at its queue?")
			after := waker.Counts()
			if after.QuietRanOut == before.QuietRanOut {
				require.Greater(t, after.Woken, before.Woken, "the %s task ran with no wake-up popped", q)
				break
			}
			unproven++
			require.Less(t, unproven, unprovenMax, "%d tasks ran only after a quiet mark ran out (the wake-up naming %s ended none): %+v then %+v", unproven, q, before, after)
		}
	}
}
