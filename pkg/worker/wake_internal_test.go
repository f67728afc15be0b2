package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

// FuzzAnnouncedTasks: whatever a wake-up carries (anyone who can write
// to the list writes it), the count is one task at least and bounded.
func FuzzAnnouncedTasks(f *testing.F) {
	for _, seed := range []string{"", "1", "32", "0", "-3", "99999999999999999999", "1e3", " 7", "x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		n := announcedTasks(payload)
		if n < 1 || n > unknownTasks {
			t.Fatalf("announcedTasks(%q) = %d, outside 1..%d", payload, n, unknownTasks)
		}
	})
}

func TestAnnouncedTasks(t *testing.T) {
	for payload, want := range map[string]int{"": unknownTasks, "1": 1, "32": 32, "0": unknownTasks, "-1": unknownTasks, "x": unknownTasks, "4000000": unknownTasks} {
		if got := announcedTasks(payload); got != want {
			t.Errorf("announcedTasks(%q) = %d, want %d", payload, got, want)
		}
	}
}

// FuzzWokenQueue: a wake-up names one of the other queues or none; a
// payload never makes the waker track a key of its own choosing.
func FuzzWokenQueue(f *testing.F) {
	for _, seed := range []string{"", "1", "queue:", "queue:notifications", "queue:maintenance", "queue:payments", "queue:other", "queue:notifications ", "QUEUE:maintenance"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		key, ok := wokenQueue(payload)
		if !ok {
			return
		}
		q := strings.TrimPrefix(payload, task.WakeQueuePrefix)
		if _, known := QueueWeights[q]; !known || q == task.QueuePayments || key != task.PendingListKey(q) {
			t.Fatalf("wokenQueue(%q) = %q", payload, key)
		}
	})
}

func TestWokenQueue(t *testing.T) {
	for payload, want := range map[string]string{
		"queue:notifications": task.PendingListKey(task.QueueNotifications),
		"queue:maintenance":   task.PendingListKey(task.QueueMaintenance),
		"queue:payments":      "", "queue:other": "", "": "", "3": "", "notifications": "",
	} {
		got, ok := wokenQueue(payload)
		if got != want || ok != (want != "") {
			t.Errorf("wokenQueue(%q) = %q, %v; want %q", payload, got, ok, want)
		}
	}
}

// TestEmptyWaitEndsOnTheSecond: an empty dequeue's wait ends on a
// multiple of the wait (where the process's other idle loops wake),
// never sooner than half a wait.
func TestEmptyWaitEndsOnTheSecond(t *testing.T) {
	w := &Waker{wait: time.Second}
	base := time.Unix(1_800_000_000, 0)
	for _, off := range []time.Duration{0, 100 * time.Millisecond, 499 * time.Millisecond, 510 * time.Millisecond, 999 * time.Millisecond} {
		now := base.Add(off)
		d := w.aligned(now)
		require.GreaterOrEqual(t, d, w.wait/2, "from %v", off)
		require.Less(t, d, w.wait*3/2+procs.AlignSlack, "from %v", off)
		require.Zero(t, now.Add(d-procs.AlignSlack).UnixNano()%int64(time.Second), "from %v: ends off the second", off)
	}
}

// TestWaitFitsTheReadTimeout: a wait's BLPOP and its answer fit in the
// client's read timeout (a pipeline has no other), with the margin; a
// client without one lets the wait run whole.
func TestWaitFitsTheReadTimeout(t *testing.T) {
	for _, c := range []struct {
		read time.Duration
		want time.Duration
	}{
		{2 * time.Second, 1500 * time.Millisecond},
		{100 * time.Millisecond, time.Millisecond},
		{-1, 0},
		{-2, 0},
	} {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: c.read})
		require.Equal(t, c.want, waitLimit(rdb), "read timeout %v", c.read)
		_ = rdb.Close()
	}
	unset := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer unset.Close()
	require.Positive(t, unset.Options().ReadTimeout, "go-redis's default")
	require.Equal(t, unset.Options().ReadTimeout-blockReadMargin, waitLimit(unset))
	require.Equal(t, fallbackWaitMax, waitLimit(redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}})))
	require.Equal(t, "0.001", blockSeconds(0), "never 0, which would block for ever")
	require.Equal(t, "1.250", blockSeconds(1250*time.Millisecond))
}

// TestEmptyLookOvertakenByAForwardLeavesTheQueueAwake: Redis runs a look
// at the notifications queue (empty), then the forwarder's script moves a
// task in; the forwarder's answer is booked first. The look's "empty"
// predates the task: it must not mark the queue quiet (the task would
// wait out the quiet mark), and the next look takes the task.
func TestEmptyLookOvertakenByAForwardLeavesTheQueueAwake(t *testing.T) {
	ctx := context.Background()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	w := NewWaker(rdb, time.Second)
	t.Cleanup(w.Stop)
	hook := wakeHook{w}.ProcessHook

	pending := task.PendingListKey(task.QueueNotifications)
	base := strings.TrimSuffix(pending, ":pending")
	scheduled := base + ":scheduled"
	require.NoError(t, rdb.ZAdd(ctx, scheduled, redis.Z{Score: 1, Member: "t1"}).Err())
	// Shaped like asynq's dequeue and forward scripts (the keys the hook
	// reads), doing their part of the work.
	look := func() *redis.Cmd {
		return redis.NewCmd(ctx, "eval", `return redis.call("RPOP", KEYS[1])`, 4, pending, base+":paused", base+":active", base+":lease")
	}
	forward := redis.NewCmd(ctx, "eval", `
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1])
for _, id in ipairs(ids) do
	redis.call("LPUSH", KEYS[2], id)
	redis.call("ZREM", KEYS[1], id)
end
return #ids`, 2, scheduled, pending, time.Now().Unix())

	overtaken := hook(func(ctx context.Context, cmd redis.Cmder) error {
		err := rdb.Process(ctx, cmd)
		require.NoError(t, hook(rdb.Process)(ctx, forward))
		return err
	})
	require.ErrorIs(t, overtaken(ctx, look()), redis.Nil)
	require.EqualValues(t, 1, forward.Val(), "the forward moved the task")
	_, quiet := w.knownQuiet(pending)
	require.False(t, quiet, "an empty look older than the forward marked the queue quiet")

	next := look()
	require.NoError(t, hook(rdb.Process)(ctx, next))
	require.Equal(t, "t1", next.Val())
	// A look with nothing overtaking it still marks the queue quiet.
	require.ErrorIs(t, hook(rdb.Process)(ctx, look()), redis.Nil)
	_, quiet = w.knownQuiet(pending)
	require.True(t, quiet, "an empty look left the queue awake")
}

// TestQuietMarkRunsOut: a queue found empty is taken as empty for
// QuietWaits waits, never beyond WakeWaitMax; the first look after that
// asks Redis and is counted. The mark is dated back, not waited for.
func TestQuietMarkRunsOut(t *testing.T) {
	key := task.PendingListKey(task.QueueNotifications)
	for wait, lasts := range map[time.Duration]time.Duration{
		time.Second:     QuietWaits * time.Second,
		5 * time.Second: WakeWaitMax,
	} {
		w := NewWaker(nil, wait)
		require.Equal(t, lasts, w.quietFor(), "wait %v", wait)
		w.quiet[key] = time.Now().Add(-lasts)
		_, quiet := w.knownQuiet(key)
		require.False(t, quiet, "wait %v: a mark %v old still answered", wait, lasts)
		require.Equal(t, WakeCounts{QuietRanOut: 1}, w.Counts(), "wait %v", wait)
	}
}
