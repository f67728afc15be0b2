package groupcommit_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/groupcommit"
)

// TestBatchesGatherWhileSlotsAreBusy: with one slot held by a slow
// commit, the calls that arrive meanwhile ride in the next batch together,
// never more than BatchMax at once, and each gets its own answer.
func TestBatchesGatherWhileSlotsAreBusy(t *testing.T) {
	release := make(chan struct{})
	var sizes []int
	var mu sync.Mutex
	first := true
	e := groupcommit.Start(context.Background(), groupcommit.Options{BatchMax: 4, InFlight: 1}, func(batch []*groupcommit.Call[int, int]) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		wait := first
		first = false
		mu.Unlock()
		if wait {
			<-release
		}
		for _, c := range batch {
			c.Answer(c.Item*10, nil)
		}
	})
	defer e.Close()

	var wg sync.WaitGroup
	results := make([]int, 10)
	wg.Add(1)
	go func() { defer wg.Done(); results[0], _ = e.Submit(context.Background(), 0) }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, 5*time.Second, time.Millisecond)
	for i := 1; i < 10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := e.Submit(context.Background(), i)
			require.NoError(t, err)
			results[i] = r
		}(i)
	}
	time.Sleep(50 * time.Millisecond) // let the nine queue behind the slow batch
	close(release)
	wg.Wait()
	for i, r := range results {
		require.Equal(t, i*10, r)
	}
	require.Equal(t, []int{1, 4, 4, 1}, sizes, "one alone, then full batches of the nine that waited")
}

// TestInFlightBoundsConcurrentCommits: never more than InFlight commits at
// once.
func TestInFlightBoundsConcurrentCommits(t *testing.T) {
	var running, most atomic.Int32
	e := groupcommit.Start(context.Background(), groupcommit.Options{BatchMax: 1, InFlight: 3}, func(batch []*groupcommit.Call[int, int]) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		running.Add(-1)
		batch[0].Answer(0, nil)
	})
	defer e.Close()
	items := make([]int, 30)
	_, errs := e.SubmitAll(context.Background(), items)
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, most.Load(), int32(3))
	require.GreaterOrEqual(t, most.Load(), int32(2), "batches do commit side by side")
}

// TestStoppedAndGoneCallersAreRefused: after Close a call is refused with
// ErrStopped through Refuse; a caller whose context ends while its batch
// commits gets the Waiting refusal, and the commit still answers without
// blocking.
func TestStoppedAndGoneCallersAreRefused(t *testing.T) {
	block := make(chan struct{})
	var stages []groupcommit.Stage
	var mu sync.Mutex
	e := groupcommit.Start(context.Background(), groupcommit.Options{BatchMax: 8, InFlight: 1,
		Refuse: func(stage groupcommit.Stage, err error) error {
			mu.Lock()
			stages = append(stages, stage)
			mu.Unlock()
			return errors.Join(errors.New("refused"), err)
		}}, func(batch []*groupcommit.Call[string, string]) {
		<-block
		for _, c := range batch {
			c.Answer("late", nil)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := e.Submit(ctx, "x")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(block)
	e.Close()
	_, err = e.Submit(context.Background(), "y")
	require.ErrorIs(t, err, groupcommit.ErrStopped)
	require.Equal(t, []groupcommit.Stage{groupcommit.Waiting, groupcommit.Queued}, stages)
}

// TestContextEndStopsTheEngine: Start's context ending stops it; Done
// closes once the batch under way has answered.
func TestContextEndStopsTheEngine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	answered, started := make(chan struct{}), make(chan struct{})
	e := groupcommit.Start(ctx, groupcommit.Options{BatchMax: 1, InFlight: 1}, func(batch []*groupcommit.Call[int, int]) {
		close(started)
		time.Sleep(20 * time.Millisecond)
		batch[0].Answer(1, nil)
		close(answered)
	})
	go func() { _, _ = e.Submit(context.Background(), 1) }()
	<-started
	cancel()
	select {
	case <-e.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not stopped")
	}
	select {
	case <-answered:
	default:
		t.Fatal("Done before the batch under way ended")
	}
}

// goroutineID reads the running goroutine's number from its stack header
// ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

// TestBatchesCommitOnLongLivedGoroutines: a hundred batches one after
// another run on the engine's InFlight goroutines, not on a goroutine
// each (whose stack would grow afresh through the commit every time).
func TestBatchesCommitOnLongLivedGoroutines(t *testing.T) {
	var mu sync.Mutex
	ids := map[string]int{}
	e := groupcommit.Start(context.Background(), groupcommit.Options{BatchMax: 4, InFlight: 2}, func(batch []*groupcommit.Call[int, int]) {
		mu.Lock()
		ids[goroutineID()]++
		mu.Unlock()
		for _, c := range batch {
			c.Answer(c.Item*2, nil)
		}
	})
	defer e.Close()
	for i := range 100 {
		got, err := e.Submit(context.Background(), i)
		require.NoError(t, err)
		require.Equal(t, 2*i, got)
	}
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, len(ids), 2, "100 batches ran on %d goroutines", len(ids))
	total := 0
	for _, n := range ids {
		total += n
	}
	require.Equal(t, 100, total)
}
