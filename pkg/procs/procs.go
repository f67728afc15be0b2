// Package procs runs a nearly idle process on one P and gives the
// runtime's default GOMAXPROCS back as soon as it is busy.
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
)

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

// Options tune Run; the zero value is the deployed behaviour.
type Options struct {
	Interval time.Duration // Interval when zero
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
	interval := opts.Interval
	if interval <= 0 {
		interval = Interval
	}
	var c Controller
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	lastCPU, lastAt := cpuTime(), time.Now()
	defer func() {
		if c.Low() {
			runtime.SetDefaultGOMAXPROCS()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticker.C:
			used := cpuTime()
			wall := now.Sub(lastAt)
			if wall <= 0 {
				continue
			}
			cores := float64(used-lastCPU) / float64(wall)
			lastCPU, lastAt = used, now
			switch c.Observe(cores) {
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

// cpuTime is the CPU the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
