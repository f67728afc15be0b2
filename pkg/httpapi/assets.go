package httpapi

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/settle/settle/pkg/payment"
)

// Asset registry caching: assets change only when an operator adds one,
// so the registry is read at most once per refresh interval
// (REGISTRY_REFRESH), and again (at most once per miss interval) when a
// request names an asset the cached copy does not know.
const (
	RegistryRefreshDefault = 30 * time.Second
	assetsMissInterval     = 5 * time.Second
)

type assetCache struct {
	load    func(context.Context) (*payment.Registry, error)
	now     func() time.Time
	refresh time.Duration

	mu       sync.Mutex
	registry *payment.Registry
	loadedAt time.Time
}

// get returns the registry, reloading it when stale. A failed reload
// keeps serving the previous copy; with none, the error is returned.
func (a *assetCache) get(ctx context.Context) (*payment.Registry, error) {
	return a.getOlderThan(ctx, a.refresh)
}

// refreshForMiss reloads after a lookup missed, unless that was just done.
func (a *assetCache) refreshForMiss(ctx context.Context) (*payment.Registry, error) {
	return a.getOlderThan(ctx, min(assetsMissInterval, a.refresh))
}

// invalidate makes the next lookup read the tables: this process's own
// additions (POST /admin/networks, /admin/assets) are seen at once. The
// copy held is kept, to serve if that reading fails.
func (a *assetCache) invalidate() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.loadedAt = time.Time{}
}

func (a *assetCache) getOlderThan(ctx context.Context, age time.Duration) (*payment.Registry, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.registry != nil && a.now().Sub(a.loadedAt) < age {
		return a.registry, nil
	}
	registry, err := a.load(ctx)
	if err != nil {
		if a.registry != nil {
			// Serve the old copy and wait a full interval before trying
			// again, so an outage does not cost every request a reload.
			a.loadedAt = a.now()
			return a.registry, nil
		}
		return nil, err
	}
	a.registry, a.loadedAt = registry, a.now()
	return registry, nil
}

// providerTransfers decodes a provider's delivery against the registry,
// and once more against a fresh read of it when the cached copy knew no
// listing (or network) for one of its transfers: a token or network
// another replica or settlectl added within REGISTRY_REFRESH is credited
// now, not answered ignored, which ends the provider's retries for good.
// Misses reload at most every assetsMissInterval, so a stream of unlisted
// (spam) tokens or unmapped networks costs little.
func (s *Server) providerTransfers(ctx context.Context, decode func(*payment.Registry) ([]payment.ReportedTransfer, []payment.Ignored)) ([]payment.ReportedTransfer, []payment.Ignored, error) {
	s.rpcReports.update(ctx)
	registry, err := s.assets.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	transfers, ignored := decode(registry)
	// A network is a miss too: Moralis names one only by its chain id,
	// which the cached copy may not know yet.
	if !slices.ContainsFunc(ignored, func(i payment.Ignored) bool {
		return i.Reason == payment.IgnoreUnknownAsset || i.Reason == payment.IgnoreUnknownNetwork
	}) {
		return transfers, ignored, nil
	}
	if fresh, err := s.assets.refreshForMiss(ctx); err == nil && fresh != registry {
		transfers, ignored = decode(fresh)
	}
	return transfers, ignored, nil
}

// rpcReportCache holds the networks a worker reported an RPC on
// (network_rpc_reports), read at most once per refresh interval, like the
// registry, when a provider delivery needs it.
type rpcReportCache struct {
	load    func(context.Context) (map[string]bool, error)
	now     func() time.Time
	refresh time.Duration

	mu       sync.Mutex
	loadedAt time.Time
	current  atomic.Pointer[map[string]bool]
}

// update reloads the reports when stale; a failed reload keeps the copy
// held (none: no network reported) and waits a full interval.
func (r *rpcReportCache) update(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.loadedAt.IsZero() && r.now().Sub(r.loadedAt) < r.refresh {
		return
	}
	r.loadedAt = r.now()
	if reported, err := r.load(ctx); err == nil {
		r.current.Store(&reported)
	}
}

// has tells whether a worker reported an RPC on network.
func (r *rpcReportCache) has(network string) bool {
	reported := r.current.Load()
	return reported != nil && (*reported)[network]
}
