package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/task"
)

// asynq's processor finds new tasks by polling: it runs its dequeue script
// on every queue and, when all are empty, sleeps TaskCheckInterval. A short
// interval keeps a trickle's latency low and costs the worker and Redis a
// few percent of a core when idle; a long one is cheap and slow. The Waker
// gives both: a Redis hook makes the empty dequeue of the payments queue
// wait (for up to WakeWaitDefault) for a wake-up that the enqueuer leaves
// on task.WakeList with each task, then look again. The wait is a BLPOP
// of that list sent in the same pipeline as the dequeue, so Redis runs
// the dequeue the moment a wake-up lands and answers both at once: the
// worker wakes once per task, not once for a wake-up and again for the
// task, and of several waiting workers only the one that pops it wakes.
// An idle worker asks Redis about once per wait; a due retry is picked
// up at once too (the hook sees asynq's forwarder move it and wakes its
// own wait through a list of its own). Tasks that come without a wake-up
// (recovered tasks) wait about the wait (see below for the other queues).
//
// A wake-up announces one task ("1"), or an unsaid number (""). A look
// that takes the last task announced leaves the queue known empty, so the
// next dequeue waits before it looks instead of after: one look per task
// at a trickle, not two (the empty look after each task cost a Redis
// round trip and a wake-up of both sides). An announcement that falls
// short costs a task at most the wait, never the task; one without a
// count makes the worker look until a look comes back empty.
//
// The other queues (notifications, maintenance) get a task from the
// scheduler every few seconds. asynq looks at them, in an order drawn by
// weight, on every dequeue: at a trickle that was 0.4 empty looks per
// event, each a Redis round trip. A queue found empty is taken as empty
// for QuietWaits waits; the scheduler's wake-up that names the queue
// (task.WakeQueuePrefix), left with each task it enqueues there, ends
// that for the worker that pops it, and a due retry the forwarder moves
// into it does for the forwarder's worker.

// Waker bounds.
const (
	// WakeWaitDefault is how long an empty dequeue waits for a wake-up,
	// on average (aligned to the second, between a half and one and a
	// half of it): the idle worker's poll period, and about how long a
	// task enqueued without a wake-up waits beyond TaskCheckInterval.
	WakeWaitDefault = time.Second
	// WakeWaitMax bounds WORKER_WAKE_WAIT: a shutdown whose own wake-up
	// is lost (Redis gone) waits out the wait under way.
	WakeWaitMax = 10 * time.Second
	// QuietWaits: the notifications and maintenance queues, found
	// empty, are asked about again after this many waits (5 s by
	// default) unless a wake-up names them first (the scheduler
	// leaves one with each task it enqueues there).
	QuietWaits = 5
	// blockReadMargin is what a wait leaves of the Redis client's read
	// timeout for the answer to arrive in: the wait's BLPOP is cut to
	// the read timeout less this (1.5 s at redisconn's 2 s), so a wait
	// never reads as a dead Redis.
	blockReadMargin = 500 * time.Millisecond
	// ownWakeTTL bounds how long the waker's own wake-up list outlives
	// the process.
	ownWakeTTL = time.Minute
	// unknownTasks is what a wake-up without a count announces: look
	// until the queue is empty.
	unknownTasks = 1 << 20
	// wakeOwnTimeout bounds leaving the waker's own wake-up.
	wakeOwnTimeout = time.Second
	// fallbackWaitMax cuts a wait on a client whose read timeout is not
	// known (not a *redis.Client) to fit redisconn's default.
	fallbackWaitMax = time.Second
)

// asynq v0.26.0's dequeue script runs with these four keys, the first
// being the queue's pending list (asynq's internal/base.PendingKey).
const dequeueKeys = 4

// Waker turns wake-ups left on task.WakeList into the end of an idle
// dequeue's wait. Its Hook goes on the asynq server's Redis client.
type Waker struct {
	rdb     redis.UniversalClient
	wait    time.Duration
	pending string // the key whose empty dequeue waits
	active  string // the same queue's active list, named by its dones
	own     string // this waker's own wake-up list (forwards, Stop)
	log     zerolog.Logger

	// waitMax is the longest wait rdb's read timeout allows (0: any).
	waitMax time.Duration
	// sending counts waiting pipelines under way, for Stop.
	sending sync.WaitGroup

	stopOnce sync.Once

	mu sync.Mutex
	// round counts wake-ups (from 1); a look is booked against the round
	// it began in. announced counts the tasks wake-ups announced that no
	// look of this worker has taken yet; drained is the round in which a
	// look found the queue empty or took the last of them (0: unknown).
	round     uint64
	announced int
	drained   uint64
	// waits counts dequeues that waited (for tests and metrics);
	// unannounced, tasks a look took that no wake-up announced (one
	// that came without its wake-up, or before it).
	waits       int64
	unannounced int64
	// How waits ended (popped): see WakeCounts. Atomics, since popped
	// holds no lock.
	ranOut, woken, wokenOwn atomic.Int64
	// quiet holds, per pending list of the other queues, when a look
	// found it empty; skipped counts the looks answered from it. due
	// holds those the forwarder has moved tasks into since their last
	// look: while one is, the payments queue does not wait.
	quiet   map[string]time.Time
	due     map[string]bool
	skipped int64
	// quietRanOut counts looks at another queue whose quiet mark had
	// run out.
	quietRanOut int64
	// forwards counts forwards into the other queues and wake-ups naming
	// them: a look that began before one is stale (Redis may have run it
	// first, the hook booked it after) and never marks the queue quiet.
	forwards uint64
	// plan answers the forwarder's scripts on sets with nothing due
	// (forward.go).
	plan forwardPlan

	// dones are the payments tasks' done scripts held for the next
	// dequeue (see done.go); doneTimer sends them alone after doneHold.
	dones     []heldDone
	doneHold  time.Duration
	doneTimer *time.Timer
	flushMu   sync.Mutex
	stopping  bool // set by Stop, under mu
	donesLost atomic.Int64
}

// NewWaker builds a waker for the payments queue; wait <= 0 is
// WakeWaitDefault.
func NewWaker(rdb redis.UniversalClient, wait time.Duration) *Waker {
	if wait <= 0 {
		wait = WakeWaitDefault
	}
	pending := task.PendingListKey(task.QueuePayments)
	return &Waker{rdb: rdb, wait: min(wait, WakeWaitMax), pending: pending,
		active: strings.TrimSuffix(pending, ":pending") + ":active", own: task.WakeList + ":" + ownSuffix(),
		waitMax: waitLimit(rdb), log: zerolog.Nop(), doneHold: doneHold,
		round: 1,
		quiet: map[string]time.Time{}, due: map[string]bool{}}
}

// WithLog sets the logger of the dones that fail; the default logs nothing.
func (w *Waker) WithLog(log zerolog.Logger) *Waker {
	w.log = log
	return w
}

// Stop ends every wait and makes dequeues look without waiting, sends
// the held dones and holds no more: call it before asynq's Shutdown,
// which waits for the dequeue under way.
func (w *Waker) Stop() {
	w.stopOnce.Do(func() {
		w.mu.Lock()
		w.stopping = true
		w.mu.Unlock()
		// Ends a wait under way (a new one no longer starts).
		w.wakeOwn()
		w.flushDones()
		w.sending.Wait()
	})
}

// ownSuffix names this waker's own wake-up list.
func ownSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// wakeOwn ends this process's wait under way, if any: one wake-up on its
// own list, which its BLPOP names first. A lost one costs the wait.
func (w *Waker) wakeOwn() {
	ctx, cancel := context.WithTimeout(context.Background(), wakeOwnTimeout)
	defer cancel()
	_, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, w.own, "1")
		p.LTrim(ctx, w.own, -1, -1)
		p.Expire(ctx, w.own, ownWakeTTL)
		return nil
	})
	if err != nil {
		w.log.Debug().Err(err).Msg("own wake-up not left; the wait under way runs out")
	}
}

// announcedTasks reads a wake-up's count: a positive decimal, else
// unknownTasks.
func announcedTasks(payload string) int {
	n, err := strconv.Atoi(payload)
	if err != nil || n <= 0 {
		return unknownTasks
	}
	return min(n, unknownTasks)
}

// wokenQueue reads a wake-up that names one of the other queues (see
// task.WakeQueuePrefix) and returns its pending list.
func wokenQueue(payload string) (string, bool) {
	q, ok := strings.CutPrefix(payload, task.WakeQueuePrefix)
	if !ok || q == task.QueuePayments {
		return "", false
	}
	if _, known := QueueWeights[q]; !known {
		return "", false
	}
	return task.PendingListKey(q), true
}

// wake books announced tasks.
func (w *Waker) wake(tasks int) {
	w.mu.Lock()
	w.announced = min(w.announced+tasks, unknownTasks)
	w.round++
	w.mu.Unlock()
}

// beforeLook is the current round and whether the queue is known empty
// since its wake-up.
func (w *Waker) beforeLook() (round uint64, drained bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.round, w.drained == w.round && w.announced <= 0
}

// looked books a look begun in round.
func (w *Waker) looked(round uint64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil && w.announced > 0:
		w.announced--
		if w.announced == 0 {
			w.drained = round
		}
	case err == nil:
		// A task nobody announced (its wake-up fell short or was lost):
		// there may be more, so look again at once.
		w.drained = 0
		w.unannounced++
	case errors.Is(err, redis.Nil):
		w.announced, w.drained = 0, round
	}
}

// waitAndLook waits up to the wait for a wake-up and then runs cmd, the
// dequeue, as one pipeline: held dones, a BLPOP of this waker's own list
// and of task.WakeList, then the dequeue, which Redis runs as soon as the
// BLPOP returns. Stopping, it only looks.
func (w *Waker) waitAndLook(ctx context.Context, next redis.ProcessHook, cmd redis.Cmder) error {
	w.mu.Lock()
	if w.stopping {
		w.mu.Unlock()
		return w.lookWithDones(ctx, next, cmd)
	}
	w.waits++
	w.sending.Add(1)
	w.mu.Unlock()
	defer w.sending.Done()

	wait := w.aligned(time.Now())
	if w.waitMax > 0 {
		wait = min(wait, w.waitMax)
	}
	pop := redis.NewStringSliceCmd(ctx, "blpop", w.own, task.WakeList, blockSeconds(wait))
	dones := w.takeDones()
	cmds := w.sendDones(ctx, w.rdb, dones, pop, cmd)
	if len(dones) > 0 {
		w.settleDones(ctx, dones, cmds)
	}
	w.popped(pop)
	return cmd.Err()
}

// waitLimit is the longest wait rdb's read timeout leaves room for (a
// pipeline has no timeout of its own, and the wait's answer must arrive
// within it); 0 when reads have no timeout.
func waitLimit(rdb redis.UniversalClient) time.Duration {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return fallbackWaitMax
	}
	// go-redis has turned an unset timeout into its default, and "none"
	// (-1, -2) into 0.
	read := c.Options().ReadTimeout
	if read <= 0 {
		return 0
	}
	return max(read-blockReadMargin, time.Millisecond)
}

// blockSeconds is a BLPOP timeout: seconds, to the millisecond, never 0
// (which would wait for ever).
func blockSeconds(d time.Duration) string {
	return strconv.FormatFloat(max(d, time.Millisecond).Seconds(), 'f', 3, 64)
}

// popped books what a wait's BLPOP returned: nothing (the wait ran out),
// this waker's own wake-up (already booked when it was left), or one
// from task.WakeList.
func (w *Waker) popped(pop *redis.StringSliceCmd) {
	got, err := pop.Result()
	switch {
	case errors.Is(err, redis.Nil):
		w.ranOut.Add(1)
		return
	case err != nil || len(got) != 2:
		return
	case got[0] == w.own:
		w.wokenOwn.Add(1)
		return
	}
	w.woken.Add(1)
	if key, ok := wokenQueue(got[1]); ok {
		w.markForwarded(key)
		return
	}
	w.wake(announcedTasks(got[1]))
}

// aligned is an empty dequeue's wait from now: to a multiple of the wait
// since the epoch, at least half a wait away, so an idle worker's looks
// fall on the second with its other idle loops (procs.UntilAligned)
// instead of drifting on their own; a wait is between a half and one
// and a half of WORKER_WAKE_WAIT, one on average.
func (w *Waker) aligned(now time.Time) time.Duration {
	d := procs.UntilAligned(now, w.wait)
	if d < w.wait/2 {
		d += w.wait
	}
	return d
}

// Waits is how many empty dequeues have waited for a wake-up.
func (w *Waker) Waits() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waits
}

// WakeCounts says how a waker's waits and looks ended (for tests and
// metrics): what proves a task was taken because of its wake-up, not
// because a wait ran out.
type WakeCounts struct {
	// RanOut: waits that no wake-up ended.
	RanOut int64
	// Woken: waits a wake-up from task.WakeList ended.
	Woken int64
	// WokenOwn: waits the waker's own wake-up ended (a forward, Stop).
	WokenOwn int64
	// Unannounced: tasks a look took that no wake-up had announced.
	Unannounced int64
	// QuietRanOut: looks at the other queues made because their quiet
	// mark had run out.
	QuietRanOut int64
}

// Counts is how the waker's waits and looks have ended so far.
func (w *Waker) Counts() WakeCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WakeCounts{
		RanOut: w.ranOut.Load(), Woken: w.woken.Load(), WokenOwn: w.wokenOwn.Load(),
		Unannounced: w.unannounced, QuietRanOut: w.quietRanOut,
	}
}

// Hook is the go-redis hook that makes an empty dequeue of the payments
// queue wait for a wake-up and then run once more.
func (w *Waker) Hook() redis.Hook { return wakeHook{w} }

type wakeHook struct{ w *Waker }

func (h wakeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h wakeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h wakeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isDone(cmd, h.w.active) {
			if h.w.holdDone(cmd) {
				return nil
			}
			return next(ctx, cmd)
		}
		if from, key, now, ok := forwardOf(cmd); ok {
			c, isCmd := cmd.(*redis.Cmd)
			if isCmd && now > 0 && h.w.plan.skip(ctx, h.w.rdb, from, now) {
				c.SetVal(int64(0))
				return nil
			}
			// The forwarder moved due retries or scheduled tasks into a
			// pending list: they come without a wake-up of their own.
			err := next(ctx, cmd)
			if !isCmd {
				return err
			}
			moved, _ := c.Val().(int64)
			h.w.plan.ran(from, moved, err)
			if err == nil && moved > 0 {
				if key == h.w.pending {
					h.w.wake(int(min(moved, unknownTasks)))
					h.w.wakeOwn()
				} else {
					// Another queue's: end its quiet mark, and the
					// payments wait asynq may be in, so the
					// processor comes round to it now.
					h.w.forwarded(key)
				}
			}
			return err
		}
		key, ok := dequeueOf(cmd)
		if !ok {
			return next(ctx, cmd)
		}
		if key != h.w.pending {
			forwards, quiet := h.w.knownQuiet(key)
			if quiet {
				cmd.SetErr(redis.Nil)
				return redis.Nil
			}
			err := next(ctx, cmd)
			h.w.lookedAt(key, err, forwards)
			return err
		}
		// Nothing announced is left: wait first, then look once (a task
		// that came without a wake-up is found within the wait). Not
		// while a forward into another queue waits for its look: asynq
		// comes to that queue after this one.
		round, drained := h.w.beforeLook()
		if drained && !h.w.othersDue() {
			err := h.w.waitAndLook(ctx, next, cmd)
			round, _ = h.w.beforeLook() // the look came after the wake-up it popped
			h.w.looked(round, err)
			return err
		}
		err := h.w.lookWithDones(ctx, next, cmd)
		h.w.looked(round, err)
		if !errors.Is(err, redis.Nil) || drained || h.w.othersDue() {
			return err // asynq goes on to its other queues, then sleeps
		}
		again := redis.NewCmd(ctx, cmd.Args()...)
		err = h.w.waitAndLook(ctx, next, again)
		round, _ = h.w.beforeLook()
		h.w.looked(round, err)
		if c, ok := cmd.(*redis.Cmd); ok {
			c.SetVal(again.Val())
			c.SetErr(again.Err())
		}
		return err
	}
}

// quietFor is how long another queue found empty is taken as empty:
// QuietWaits waits, at most WakeWaitMax. The scheduler's wake-up that
// names the queue, or a forward into it, ends it sooner.
func (w *Waker) quietFor() time.Duration { return min(QuietWaits*w.wait, WakeWaitMax) }

// knownQuiet reports whether a look at the pending list key found it
// empty less than quietFor ago (counting the look it answers), and the
// forwards booked so far, for lookedAt.
func (w *Waker) knownQuiet(key string) (forwards uint64, quiet bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.quiet[key]
	if !ok {
		return w.forwards, false
	}
	if time.Since(at) >= w.quietFor() {
		w.quietRanOut++
		return w.forwards, false
	}
	if w.stopping {
		return w.forwards, false // shutting down: look, as asynq expects
	}
	w.skipped++
	return w.forwards, true
}

// lookedAt books a look at another queue's pending list, begun when
// forwards forwards had been booked: empty marks it quiet, anything else
// ends that. A look overtaken by a forward only ends the quiet mark: its
// "empty" may predate the tasks forwarded.
func (w *Waker) lookedAt(key string, err error, forwards uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.forwards != forwards {
		delete(w.quiet, key)
		return
	}
	delete(w.due, key)
	if errors.Is(err, redis.Nil) {
		w.quiet[key] = time.Now()
		return
	}
	delete(w.quiet, key)
}

// forwarded books a forward of due tasks into another queue's pending
// list and ends the payments wait asynq may be in.
func (w *Waker) forwarded(key string) {
	w.markForwarded(key)
	w.wakeOwn()
}

// markForwarded books tasks in another queue's pending list: it is no
// longer quiet, and it is due for a look before the payments queue waits
// again (a forward can land between asynq's look at it and the payments
// wait of the same round).
func (w *Waker) markForwarded(key string) {
	w.mu.Lock()
	delete(w.quiet, key)
	w.due[key] = true
	w.forwards++
	w.mu.Unlock()
	w.wake(0)
}

// othersDue reports whether a forward into another queue awaits a look.
func (w *Waker) othersDue() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.due) > 0
}

// Skipped is how many dequeues of the other queues were answered empty
// without asking Redis.
func (w *Waker) Skipped() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.skipped
}

// dequeueOf returns the pending list of an asynq dequeue:
// EVALSHA/EVAL sha-or-script 4 <pending> <paused> <active> <lease> ...
func dequeueOf(cmd redis.Cmder) (string, bool) {
	name := cmd.Name()
	if name != "evalsha" && name != "eval" {
		return "", false
	}
	args := cmd.Args()
	if len(args) < 3+dequeueKeys {
		return "", false
	}
	n, ok := args[2].(int)
	key, _ := args[3].(string)
	lease, _ := args[3+dequeueKeys-1].(string)
	if !ok || n != dequeueKeys || !strings.HasSuffix(key, "}:pending") || !strings.HasSuffix(lease, ":lease") {
		return "", false
	}
	return key, true
}

// forwardOf returns the delayed set and the pending list of asynq's
// forward script, and the unix time it runs with (0 if not an integer):
// EVALSHA/EVAL sha-or-script 2 <retry|scheduled> <pending> <now> ...
func forwardOf(cmd redis.Cmder) (from, to string, now int64, ok bool) {
	name := cmd.Name()
	if name != "evalsha" && name != "eval" {
		return "", "", 0, false
	}
	args := cmd.Args()
	if len(args) < 5 {
		return "", "", 0, false
	}
	n, isInt := args[2].(int)
	from, _ = args[3].(string)
	to, _ = args[4].(string)
	// asynq's enqueue script has two keys too (the task's, then pending).
	if !isInt || n != 2 || !strings.HasSuffix(to, "}:pending") || !(strings.HasSuffix(from, "}:retry") || strings.HasSuffix(from, "}:scheduled")) {
		return "", "", 0, false
	}
	if len(args) > 5 {
		now, _ = args[5].(int64)
	}
	return from, to, now, true
}
