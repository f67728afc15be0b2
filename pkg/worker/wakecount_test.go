package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// three with an unsaid count: every one runs, the unannounced ones after
// the wait under way and together, not a wait each.
func TestShortAnnouncementLosesNoTask(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan time.Time, 8)
	rdb := unboundedRedis(t, p)
	waker, _ := wakingServerOn(t, rdb, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	}))
	trips := &tripLog{}
	rdb.AddHook(trips) // inside the waker's hook: what reaches Redis
	waitingAll(t, p, waker)
	client := asynq.NewClientFromRedisClient(p.rdb)
	ctx := context.Background()
	for round, publish := range []func() error{
		func() error { return outbox.PublishWakeFor(ctx, p.rdb, 1) },
		func() error { return outbox.PublishWake(ctx, p.rdb) },
	} {
		from := trips.len()
		for i := range 3 {
			_, err := client.Enqueue(asynq.NewTask("test:short", nil), asynq.Queue(task.QueuePayments), asynq.TaskID(fmt.Sprintf("short-%d-%d", round, i)))
			require.NoError(t, err)
		}
		require.NoError(t, publish())
		for i := range 3 {
			select {
			case <-ran:
			case <-time.After(hangGuard):
				t.Fatalf("round %d: task %d not run", round, i)
			}
		}
		// Until the third take, at most one wait may run out: the one
		// under way when the announcement fell short (or before it
		// came), whose look finds an unannounced task and makes the
		// worker look again at once. A task that waited a wait of its
		// own costs a second. Counted in round trips, not seconds: a
		// stalled test adds none before the third take.
		got := trips.since(from)
		ranOut, took := 0, 0
		for _, trip := range got {
			if took == 3 {
				break
			}
			if trip.wait == waitRanOut {
				ranOut++
			}
			if trip.took {
				took++
			}
		}
		require.Equal(t, 3, took, "round %d: takes recorded: %+v", round, got)
		require.LessOrEqual(t, ranOut, 1, "round %d: an unannounced task waited a wait of its own: %+v", round, got)
	}
}

// How the wait in front of a look ended (tripLog); "" when it had none.
const (
	waitRanOut  = "ran out" // no wake-up came
	waitWoken   = "woken"   // a wake-up, the waker's own or task.WakeList's
	waitRefused = "refused" // Redis refused the BLPOP
)

// trip is one round trip of the payments queue's dequeue.
type trip struct {
	wait string
	took bool
}

// tripLog records in order the round trips that carry a dequeue of the
// payments queue: how the wait in front of it ended and whether it took a
// task. It sits inside the waker's hook: what reaches Redis.
type tripLog struct {
	mu    sync.Mutex
	trips []trip
}

func (l *tripLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *tripLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.record([]redis.Cmder{cmd})
		return err
	}
}
func (l *tripLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.record(cmds)
		return err
	}
}

func (l *tripLog) record(cmds []redis.Cmder) {
	tr, dequeue := trip{}, false
	for _, c := range cmds {
		args := c.Args()
		switch {
		case c.Name() == "blpop" && errors.Is(c.Err(), redis.Nil):
			tr.wait = waitRanOut
		case c.Name() == "blpop" && c.Err() == nil:
			tr.wait = waitWoken
		case c.Name() == "blpop":
			tr.wait = waitRefused
		case (c.Name() == "evalsha" || c.Name() == "eval") && len(args) > 3 && args[2] == 4 && args[3] == task.PendingListKey(task.QueuePayments):
			dequeue = true
			if d, ok := c.(*redis.Cmd); ok && d.Err() == nil && d.Val() != nil {
				tr.took = true // a task's message, not an empty answer
			}
		}
	}
	if dequeue {
		l.mu.Lock()
		l.trips = append(l.trips, tr)
		l.mu.Unlock()
	}
}

func (l *tripLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.trips)
}

// since is the trips recorded after the first from.
func (l *tripLog) since(from int) []trip {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]trip(nil), l.trips[from:]...)
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
		case <-time.After(hangGuard):
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
// into a queue found empty runs when the queue's quiet mark runs out (how
// long a mark lasts: TestQuietMarkRunsOut).
func TestQuietQueuesStillRunTheirTasks(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	ran := make(chan string, 16)
	waker := wakingServer(t, p, asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		ran <- id
		return nil
	}))
	client := asynq.NewClientFromRedisClient(p.rdb)
	for _, q := range []string{task.QueueNotifications, task.QueueMaintenance} {
		p.waitFor(q+" found empty", hangGuard, func() bool { return waker.Quiet(q) })
		before := waker.Counts()
		_, err := client.Enqueue(asynq.NewTask("test:"+q, nil), asynq.Queue(q), asynq.TaskID("plain-"+q))
		require.NoError(t, err)
		select {
		case id := <-ran:
			require.Equal(t, "plain-"+q, id)
		case <-time.After(hangGuard):
			t.Fatalf("%s task not run (its quiet mark never ran out?)", q)
		}
		// The queue was quiet when the task came and nothing named it:
		// only a look whose mark had run out could find it.
		require.Greater(t, waker.Counts().QuietRanOut, before.QuietRanOut, "the %s task ran with no quiet mark run out: the queue was not taken as empty", q)
	}
}

// TestForwardedRetryEndsTheQuietMark: a retry the forwarder moves into a
// queue found empty runs at its due time, not after the quiet mark or the
// payments wait the processor is in.
func TestForwardedRetryEndsTheQuietMark(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	var failed sync.Map // task IDs whose first run failed
	failing, fail := make(chan string), make(chan struct{})
	retried := make(chan string, 4)
	// Whole waits (2.5 to 7.5 s): fewer run out during a retry.
	waker, _ := wakingServerOn(t, unboundedRedis(t, p), asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if _, again := failed.LoadOrStore(id, true); !again {
			failing <- id
			<-fail
			return errors.New("once")
		}
		retried <- id
		return nil
	}))
	waitingAll(t, p, waker)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(p.rdb)
	// A retry is proof when neither a payments wait nor a quiet mark ran
	// out between its task's failure and its run: the queue was found
	// empty again before the failure, the processor waits, and only the
	// hook's booking of the forward ends both. A retry takes ~100 ms
	// (due 10 ms after the failure, forwarded within the forwarder's
	// 100 ms); a wait runs out every 5 s, a mark every 10 s per queue: a
	// retry during which one did proves nothing and another task is
	// sent. Broken, every retry waits for both.
	provenRetry(t, p, waker, "or a quiet mark; the forward ended neither", func(i int) worker.WakeCounts {
		id := fmt.Sprintf("retried-%d", i)
		_, err := client.Enqueue(asynq.NewTask("test:retried", nil), asynq.Queue(task.QueueMaintenance), asynq.TaskID(id), asynq.MaxRetry(3))
		require.NoError(t, err)
		require.NoError(t, outbox.PublishQueueWake(ctx, p.rdb, task.QueueMaintenance))
		select {
		case got := <-failing:
			require.Equal(t, id, got)
		case <-time.After(hangGuard):
			t.Fatalf("%s not run", id)
		}
		// The first run fails once the processor has found the queue
		// empty again (the task is active), so the retry comes to a
		// quiet queue.
		p.waitFor("the maintenance queue found empty", hangGuard, func() bool { return waker.Quiet(task.QueueMaintenance) })
		before := waker.Counts()
		fail <- struct{}{}
		select {
		case got := <-retried:
			require.Equal(t, id, got)
		case <-time.After(hangGuard):
			t.Fatalf("%s: no retry", id)
		}
		return before
	}, func(before, after worker.WakeCounts) bool {
		return after.RanOut > before.RanOut || after.QuietRanOut > before.QuietRanOut
	})
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
	// A crowd is proof when no quiet mark ran out from its enqueue to its
	// last run and none of its payments tasks was taken unannounced: then
	// the hook booked every forward (a forward into a quiet queue ends its
	// mark; one into the payments queue announces its tasks). A crowd
	// takes 2 to 3 s and starts with both marks (10 s, each renewed as
	// it runs out) more than markLeft from running out: both are, for
	// part of every 10 s, whatever their phases. One during which a mark
	// ran out all the same (a stall), or whose payments tasks came
	// before their booking (a look racing the forward's answer), proves
	// nothing and another crowd is sent. Broken, every crowd waits for
	// a mark or is taken unannounced.
	const unprovenMax, markLeft = 3, 4500 * time.Millisecond
	for attempt, unproven := 0, 0; ; attempt++ {
		p.waitFor("both quiet marks far from running out", hangGuard, func() bool {
			return waker.QuietLeft(task.QueueNotifications) > markLeft && waker.QuietLeft(task.QueueMaintenance) > markLeft
		})
		before := waker.Counts()
		late := scheduleCrowd(t, client, attempt, ran)
		after := waker.Counts()
		if !late && after.QuietRanOut == before.QuietRanOut && after.Unannounced == before.Unannounced {
			break
		}
		unproven++
		require.Less(t, unproven, unprovenMax, "%d crowds unproven (enqueued late: %v; a quiet mark ran out or a task was taken unannounced: %+v then %+v)", unproven, late, before, after)
	}
	require.Positive(t, forwards.n.Load()-scripts, "the due tasks moved without the real script?")
}

// scheduleCrowd schedules a crowd of tasks (more than a forward script
// moves at once), a fifth of them on the notifications queue, the rest
// on the payments queue, for a time a second or two away, and requires
// every one to run, none before its time. late: some were enqueued after
// it (straight into the pending list, without the forwarder).
func scheduleCrowd(t *testing.T, client *asynq.Client, attempt int, ran <-chan string) (late bool) {
	t.Helper()
	const crowd = 250
	// asynq dates a scheduled task to the second (its score is the unix
	// second), and enqueues one whose time has passed straight into the
	// pending list: the time is on a second, at least a second away.
	due := time.Now().Truncate(time.Second).Add(2 * time.Second)
	for i := range crowd {
		q := task.QueuePayments
		if i%5 == 0 {
			q = task.QueueNotifications
		}
		info, err := client.Enqueue(asynq.NewTask("test:later", nil), asynq.Queue(q), asynq.TaskID(fmt.Sprintf("later-%d-%d", attempt, i)), asynq.ProcessAt(due))
		require.NoError(t, err)
		late = late || info.State != asynq.TaskStateScheduled
	}
	seen := map[string]bool{}
	deadline := time.After(time.Until(due) + hangGuard)
	for len(seen) < crowd {
		select {
		case id := <-ran:
			// A scheduled task's time is what the test is about.
			require.False(t, time.Now().Before(due), "%s ran before its time", id)
			seen[id] = true
		case <-deadline:
			t.Fatalf("%d of %d scheduled tasks ran", len(seen), crowd)
		}
	}
	return late
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
