// Package procs runs a nearly idle process on one P and gives the
// runtime's default GOMAXPROCS back as soon as it is busy; it also sets
// the services' garbage-collector target (TuneGC).
//
// Why: at a trickle every goroutine a request wakes makes the Go scheduler
// wake a second thread to look for work it will not find (wakep and a
// spinning M), and on a virtual machine each such wake-up of an idle vCPU
// costs more than the event's own work. On the trickle benchmark (100
// events/s) one P instead of two takes the api from 24 to 13 thread
// wake-ups per event and the worker from 30 to 20, and saved 0.15-0.4
// CPU-ms/event across the two in back-to-back pairs, latency no worse.
// Under load the same setting would cap a process at one core, so the
// controller keeps it only while the process uses little CPU.
package procs

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"
)

// The controller's bounds. A busy interval restores the default at once; a
// process goes down to one P only after QuietIntervals quiet intervals in
// a row, so a bursty load does not flap.
const (
	// Interval is how often the process's CPU use is sampled.
	Interval = 250 * time.Millisecond
	// BusyCores: an interval using at least this much of one core is busy.
	BusyCores = 0.4
	// QuietCores: an interval using at most this much of one core is quiet.
	QuietCores = 0.2
	// QuietIntervals in a row take the process down to one P (2 s).
	QuietIntervals = 8
	// IdleInterval is the sampling period of a process on one P whose
	// last interval used at most IdleCores: each sample wakes an idle
	// process, which on a virtual machine cost about a tenth of the idle
	// api's, worker's and scheduler's CPU at four a second. Active ends
	// the long period, so load that arrives is seen within Interval.
	IdleInterval = time.Second
	// IdleCores: an interval using at most this much of one core is idle.
	IdleCores = 0.02
)

// sleeping is set while Run waits out an IdleInterval; kick wakes it.
var (
	sleeping atomic.Bool
	kick     = make(chan struct{}, 1)
	samples  atomic.Int64 // for tests
)

// Active tells the controller that work has arrived: one atomic load
// unless it is in its idle period, which this ends. Call it where a
// process's work comes in (a request, a task).
func Active() {
	if sleeping.Load() && sleeping.CompareAndSwap(true, false) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

// Controller decides the GOMAXPROCS of the next interval from the CPU use
// of the last one. It is not safe for concurrent use.
type Controller struct {
	low   bool
	quiet int
}

// Decision is what Observe asks for.
type Decision int

const (
	Keep    Decision = iota // leave GOMAXPROCS as it is
	Lower                   // one P
	Restore                 // the runtime's default
)

// Observe takes the CPU use of the last interval, in cores.
func (c *Controller) Observe(cores float64) Decision {
	switch {
	case cores >= BusyCores:
		c.quiet = 0
		if c.low {
			c.low = false
			return Restore
		}
	case cores <= QuietCores:
		c.quiet++
		if !c.low && c.quiet >= QuietIntervals {
			c.low = true
			return Lower
		}
	default:
		c.quiet = 0
	}
	return Keep
}

// Low reports whether the controller has the process on one P.
func (c *Controller) Low() bool { return c.low }

// AlignSlack: an aligned wait ends this long after its boundary, so the
// wall clock read then has passed it.
const AlignSlack = 2 * time.Millisecond

// UntilAligned is the wait from now to the next multiple of every since
// the epoch (plus AlignSlack). An idle process's periodic loops that wait
// this way (this sampler, the scheduler's jobs, the worker's empty
// dequeue) wake together: one burst of the runtime's threads instead of
// one for each loop.
func UntilAligned(now time.Time, every time.Duration) time.Duration {
	if every <= 0 {
		return AlignSlack
	}
	n := now.UnixNano()
	return time.Duration((n/int64(every)+1)*int64(every)-n) + AlignSlack
}

// Options tune Run; the zero value is the deployed behaviour.
type Options struct {
	Interval     time.Duration // Interval when zero
	IdleInterval time.Duration // IdleInterval when zero
	// OnChange is told every change (for the log), with the new setting.
	OnChange func(procs int)
}

// Applies reports whether adapting makes sense here: more than one P by
// default, and no GOMAXPROCS chosen by the operator (which is kept as is).
func Applies(getenv func(string) string) bool {
	return getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > 1
}

// Run adapts GOMAXPROCS until ctx ends, then restores the default.
func Run(ctx context.Context, opts Options) {
	interval, idleInterval := opts.Interval, opts.IdleInterval
	if interval <= 0 {
		interval = Interval
	}
	if idleInterval <= 0 {
		idleInterval = IdleInterval
	}
	var c Controller
	timer := time.NewTimer(interval)
	defer timer.Stop()
	lastCPU, lastAt := cpuTime(), time.Now()
	defer func() {
		sleeping.Store(false)
		if c.Low() {
			runtime.SetDefaultGOMAXPROCS()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
			// Work came in during the idle period: sample at Interval
			// again, measuring from the last sample as before.
			timer.Reset(interval)
			continue
		case now := <-timer.C:
			samples.Add(1)
			used := cpuTime()
			wall := now.Sub(lastAt)
			if wall <= 0 {
				timer.Reset(interval)
				continue
			}
			cores := float64(used-lastCPU) / float64(wall)
			lastCPU, lastAt = used, now
			decision := c.Observe(cores)
			if c.Low() && cores <= IdleCores {
				sleeping.Store(true)
				// On the second, with the process's other idle loops.
				timer.Reset(UntilAligned(time.Now(), idleInterval))
			} else {
				sleeping.Store(false)
				timer.Reset(interval)
			}
			switch decision {
			case Lower:
				runtime.GOMAXPROCS(1)
			case Restore:
				// Also gives back the runtime's own updates of the
				// default (CPU quota changes), which an explicit
				// GOMAXPROCS call turns off.
				runtime.SetDefaultGOMAXPROCS()
			default:
				continue
			}
			if opts.OnChange != nil {
				opts.OnChange(runtime.GOMAXPROCS(0))
			}
		}
	}
}

// GCPercent is the GOGC a service runs with when the operator sets none.
// Its live heap is small (tens of MiB) and nearly all it allocates dies
// within one request or task, so at Go's default of 100 a collection ran
// every few MiB of traffic: flat out, marking and sweeping took about a
// fifth of the api's CPU and a third of the worker's. At 400 a collection
// runs a quarter as often for a somewhat larger heap (benchmarks: peak
// RSS api 53 -> 70 MiB, worker 46 -> 55 MiB), and a cycle's fixed cost
// (waking every P's mark worker) is paid a quarter as often.
const GCPercent = 400

// TuneGC sets GCPercent unless the operator chose GOGC (kept as it is,
// "off" included) and reports whether it did. GOMEMLIMIT, when set, still
// caps the heap: the runtime collects earlier as it nears the limit.
func TuneGC(getenv func(string) string) bool {
	if getenv("GOGC") != "" {
		return false
	}
	debug.SetGCPercent(GCPercent)
	return true
}

// cpuTime is the CPU the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
