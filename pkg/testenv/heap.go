package testenv

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// liveHeap is the bytes of live and not-yet-swept heap objects.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// PeakHeapGrowth runs f while sampling the heap every 100 µs and returns
// the highest growth seen over the heap (after a GC) before f: what f
// held at its peak. The collector runs at GOGC 25 meanwhile, so garbage
// (a grown buffer's old array) is not mistaken for what f holds: at the
// default it can pile up to the live heap's size again, and the figure
// would swing with the GC's timing.
func PeakHeapGrowth(f func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	runtime.GC()
	base := liveHeap()
	var peak atomic.Uint64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			if h := liveHeap(); h > base && h-base > peak.Load() {
				peak.Store(h - base)
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	f()
	close(done)
	<-stopped
	return peak.Load()
}
