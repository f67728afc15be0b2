package monitor

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/settle/settle/pkg/postgres"
)

// Backlog refresh cadence and bound (BACKLOG_INTERVAL, BACKLOG_TIMEOUT).
const (
	BacklogIntervalDefault = 15 * time.Second
	BacklogTimeoutDefault  = postgres.BacklogTimeoutDefault
)

// BacklogStatuses are the statuses settle_backlog_events reports; failed
// counts only events with an open dead letter.
var BacklogStatuses = []string{"pending", "enqueued", "processing", "awaiting_finality", "failed"}

// BacklogStore reads the backlog.
type BacklogStore interface {
	Backlog(ctx context.Context, timeout time.Duration) (postgres.Backlog, error)
}

// Backlog exports the backlog waiting in PostgreSQL, which the queue depth
// gauge (capped by QUEUE_DEPTH_MAX) cannot see.
type Backlog struct {
	store   BacklogStore
	timeout time.Duration
	events  *prometheus.GaugeVec
	oldest  prometheus.Gauge
	// networks seen so far: each keeps a series per status, 0 once
	// drained, so an autoscaler never reads "no data" for an idle network.
	networks map[string]bool
}

// NewBacklog registers the gauges on reg (which may be nil).
func NewBacklog(store BacklogStore, timeout time.Duration, reg prometheus.Registerer) *Backlog {
	b := &Backlog{
		store: store, timeout: timeout, networks: map[string]bool{},
		events: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_backlog_events",
			Help: "Events waiting in PostgreSQL by status and network (failed: with an open dead letter), at the last refresh.",
		}, []string{"status", "network"}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_backlog_oldest_pending_seconds",
			Help: "Age of the oldest pending event at the last refresh; 0 when none.",
		}),
	}
	if reg != nil {
		reg.MustRegister(b.events, b.oldest)
	}
	return b
}

// Refresh reads the backlog once. On error the gauges keep their values;
// settle_job_last_success_timestamp_seconds{job_name="backlog_gauges"}
// says how old they are.
func (b *Backlog) Refresh(ctx context.Context) error {
	got, err := b.store.Backlog(ctx, b.timeout)
	if err != nil {
		return err
	}
	counts := map[[2]string]int64{}
	for _, c := range got.Counts {
		b.networks[c.Network] = true
		counts[[2]string{c.Status, c.Network}] = c.Events
	}
	for network := range b.networks {
		for _, status := range BacklogStatuses {
			b.events.WithLabelValues(status, network).Set(float64(counts[[2]string{status, network}]))
		}
	}
	b.oldest.Set(got.OldestPending.Seconds())
	return nil
}
