package monitor

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/settle/settle/pkg/postgres"
)

// Provider coverage cadence and bounds (PROVIDER_MISS_INTERVAL,
// PROVIDER_MISS_GRACE).
const (
	ProviderMissIntervalDefault = time.Minute
	// ProviderMissGraceDefault is how long a provider has to report a
	// transfer before it counts as missed.
	ProviderMissGraceDefault = 10 * time.Minute
	// ProviderMissScanned bounds the newest events one refresh reads.
	ProviderMissScanned = 20000
)

// ProviderStore reads which providers reported which transfers.
type ProviderStore interface {
	ProviderMisses(ctx context.Context, scanned int, grace time.Duration) ([]postgres.ProviderMiss, error)
}

// Providers exports each provider's miss rate: of the newest transfer
// deposits (older than the grace), how many it never reported. With two
// providers and the scanner, a deposit one provider missed is still
// credited; the gauge says which provider is losing deliveries.
type Providers struct {
	store   ProviderStore
	grace   time.Duration
	missed  *prometheus.GaugeVec
	sampled *prometheus.GaugeVec
	seen    map[string]bool
}

// NewProviders registers the gauges on reg (which may be nil).
func NewProviders(store ProviderStore, grace time.Duration, reg prometheus.Registerer) *Providers {
	p := &Providers{
		store: store, grace: grace, seen: map[string]bool{},
		missed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_provider_missed_deposits",
			Help: "Of the newest transfer deposits older than PROVIDER_MISS_GRACE, those this provider never reported (another provider or the scanner did).",
		}, []string{"provider"}),
		sampled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_provider_sampled_deposits",
			Help: "Transfer deposits the miss count of settle_provider_missed_deposits is taken over.",
		}, []string{"provider"}),
	}
	if reg != nil {
		reg.MustRegister(p.missed, p.sampled)
	}
	return p
}

// Refresh reads the sample once; a provider that reported nothing in it
// drops to zero rather than keeping an old figure.
func (p *Providers) Refresh(ctx context.Context) error {
	got, err := p.store.ProviderMisses(ctx, ProviderMissScanned, p.grace)
	if err != nil {
		return err
	}
	current := map[string]postgres.ProviderMiss{}
	for _, m := range got {
		current[m.Reporter] = m
		p.seen[m.Reporter] = true
	}
	for provider := range p.seen {
		m := current[provider]
		p.missed.WithLabelValues(provider).Set(float64(m.Missed))
		p.sampled.WithLabelValues(provider).Set(float64(m.Sampled))
	}
	return nil
}
