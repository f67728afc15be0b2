package procs

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

func TestControllerDecisions(t *testing.T) {
	quiet := func(n int) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = 0.05
		}
		return s
	}
	cases := []struct {
		name  string
		cores []float64
		want  []Decision // the decision after the last sample, and Low then
		low   bool
	}{
		{"one quiet interval short of lowering", quiet(QuietIntervals - 1), []Decision{Keep}, false},
		{"quiet for long enough lowers", quiet(QuietIntervals), []Decision{Lower}, true},
		{"and stays low while quiet", quiet(QuietIntervals + 5), []Decision{Keep}, true},
		{"a busy interval restores at once", append(quiet(QuietIntervals), BusyCores), []Decision{Restore}, false},
		{"an interval between the bounds restarts the count", append(append(quiet(QuietIntervals-1), 0.3), quiet(QuietIntervals-1)...), []Decision{Keep}, false},
		{"a middling interval keeps a low process low", append(quiet(QuietIntervals), 0.3, 0.35), []Decision{Keep}, true},
		{"busy from the start keeps the default", []float64{1.5, 0.9, 0.6}, []Decision{Keep}, false},
		{"after a restore it needs the whole quiet run again", append(append(quiet(QuietIntervals), 1), quiet(QuietIntervals-1)...), []Decision{Keep}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Controller
			var got Decision
			for _, v := range tc.cores {
				got = c.Observe(v)
			}
			if got != tc.want[0] || c.Low() != tc.low {
				t.Fatalf("after %v: decision %d low %v, want %d low %v", tc.cores, got, c.Low(), tc.want[0], tc.low)
			}
		})
	}
}

// The real loop on this process: idle, it goes down to one P; made busy,
// it comes back; stopped, it leaves the default.
func TestRunLowersWhenIdleAndRestoresWhenBusy(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	ctx, cancel := context.WithCancel(context.Background())
	var changes atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Interval: 20 * time.Millisecond, OnChange: func(int) { changes.Add(1) }})
	}()
	waitFor(t, "one P while idle", func() bool { return runtime.GOMAXPROCS(0) == 1 })

	stop := make(chan struct{})
	go burnCore(stop)
	waitFor(t, "more than one P while busy", func() bool { return runtime.GOMAXPROCS(0) > 1 })
	close(stop)
	waitFor(t, "one P again once idle", func() bool { return runtime.GOMAXPROCS(0) == 1 })
	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got <= 1 && runtime.NumCPU() > 1 {
		t.Fatalf("after Run stopped: GOMAXPROCS %d, want the default", got)
	}
	if changes.Load() < 3 {
		t.Fatalf("OnChange told %d changes, want at least 3", changes.Load())
	}
}

func TestAppliesKeepsTheOperatorsChoice(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	if Applies(func(string) string { return "2" }) {
		t.Fatal("adapting although GOMAXPROCS is set")
	}
	if !Applies(func(string) string { return "" }) {
		t.Fatal("not adapting with two Ps and no GOMAXPROCS")
	}
	runtime.GOMAXPROCS(1)
	if Applies(func(string) string { return "" }) {
		t.Fatal("adapting a process that has one P anyway")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (GOMAXPROCS %d)", what, runtime.GOMAXPROCS(0))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Idle on one P, the loop samples once per IdleInterval (here: never
// within the test); Active ends that at once, so a process made busy
// gets its Ps back within Interval, not IdleInterval.
func TestIdleSamplesRarelyAndActiveEndsIt(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Interval: 10 * time.Millisecond, IdleInterval: time.Hour})
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "one P and the idle period", func() bool { return runtime.GOMAXPROCS(0) == 1 && sleeping.Load() })
	before := samples.Load()
	time.Sleep(300 * time.Millisecond) // thirty intervals
	if n := samples.Load() - before; n != 0 {
		t.Fatalf("%d samples during the idle period, want none", n)
	}

	stop := make(chan struct{})
	defer close(stop)
	go burnCore(stop)
	time.Sleep(100 * time.Millisecond)
	if runtime.GOMAXPROCS(0) != 1 || samples.Load() != before {
		t.Fatalf("busy but not told: GOMAXPROCS %d after %d samples, want 1 after none", runtime.GOMAXPROCS(0), samples.Load()-before)
	}
	Active()
	Active() // a second call while the first is taken is a no-op, not a block
	// Told again while waiting, as a process is by each request: on a
	// loaded machine the first sample after the kick, which spans the idle
	// period, can read as idle and send the sampler back to it (a CI run
	// timed out here with the told process still on one P).
	waitFor(t, "more than one P once told", func() bool { Active(); return runtime.GOMAXPROCS(0) > 1 })
}

// burnCore uses a whole core until stop is closed.
func burnCore(stop <-chan struct{}) {
	x := 0
	for {
		select {
		case <-stop:
			return
		default:
			for i := range 1_000_000 {
				x += i
			}
		}
	}
}

// TestUntilAlignedEndsOnTheBoundary: waits from anywhere in a period end
// just past the same boundary, and a shorter period's boundaries include
// a longer one's.
func TestUntilAlignedEndsOnTheBoundary(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	for _, off := range []time.Duration{0, time.Nanosecond, 250 * time.Millisecond, time.Second - time.Nanosecond} {
		now := base.Add(off)
		if end := now.Add(UntilAligned(now, time.Second)); !end.Equal(base.Add(time.Second + AlignSlack)) {
			t.Errorf("from %v: ends at %v", off, end)
		}
	}
	now := base.Add(3700 * time.Millisecond)
	if two := now.Add(UntilAligned(now, 2*time.Second)).Add(-AlignSlack); two.UnixNano()%int64(time.Second) != 0 || !two.After(now) {
		t.Errorf("a 2 s boundary at %v is not a 1 s one after %v", two, now)
	}
	if d := UntilAligned(now, 0); d != AlignSlack {
		t.Errorf("no period: %v", d)
	}
}

// gcPercent reads the collector's setting without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestTuneGCDefaultsUnlessTheOperatorChose(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	env := func(gogc string) func(string) string {
		return func(name string) string {
			if name == "GOGC" {
				return gogc
			}
			return ""
		}
	}
	if !TuneGC(env("")) || gcPercent() != GCPercent {
		t.Fatalf("without GOGC: percent %d, want %d", gcPercent(), GCPercent)
	}
	for _, chosen := range []string{"150", "off"} {
		debug.SetGCPercent(100)
		if TuneGC(env(chosen)) || gcPercent() != 100 {
			t.Fatalf("GOGC=%s: TuneGC changed the percent to %d", chosen, gcPercent())
		}
	}
}
