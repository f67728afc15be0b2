package loadgen

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// bar is a one-line progress bar on a terminal (or any writer).
type bar struct {
	w       io.Writer
	total   int
	started time.Time
	last    time.Time
}

const barWidth = 30

func newBar(w io.Writer, total int) *bar {
	return &bar{w: w, total: total, started: time.Now()}
}

func (b *bar) draw(label string, n, total int, extra string) {
	if b.w == nil || total <= 0 {
		return
	}
	if time.Since(b.last) < 100*time.Millisecond && n < total {
		return
	}
	b.last = time.Now()
	filled := barWidth * n / total
	fmt.Fprintf(b.w, "\r%-9s [%s%s] %3d%% %d/%d %s   ", label, strings.Repeat("=", filled), strings.Repeat(" ", barWidth-filled), 100*n/total, n, total, extra)
}

func (b *bar) set(sent int, requests int64) {
	elapsed := time.Since(b.started).Seconds()
	b.draw("sending", sent, b.total, fmt.Sprintf("%.0f req/s", float64(requests)/max(elapsed, 1e-9)))
}

func (b *bar) settling(terminal, accepted int) {
	b.draw("settling", terminal, accepted, "")
}

func (b *bar) done() {
	if b.w != nil {
		fmt.Fprintln(b.w)
	}
}
