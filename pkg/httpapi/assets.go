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

// assetCache holds the registry; rpcReportCache the networks a worker
// reported an RPC on (network_rpc_reports). Both are read from their
// tables at most once per refresh interval.
type (
	assetCache     = tableCache[*payment.Registry]
	rpcReportCache = tableCache[map[string]bool]
)

// tableCache holds a copy of what load reads, read again when older than
// refresh. The copy sits behind an atomic pointer so that held can read
// it without a context or the lock.
type tableCache[T any] struct {
	load    func(context.Context) (T, error)
	now     func() time.Time
	refresh time.Duration

	mu       sync.Mutex
	loadedAt time.Time
	current  atomic.Pointer[T]
}

// get returns the copy, reloading it when stale. A failed reload keeps
// serving the previous copy; with none, the error is returned.
func (c *tableCache[T]) get(ctx context.Context) (T, error) {
	return c.getOlderThan(ctx, c.refresh)
}

// refreshForMiss reloads after a lookup missed, unless that was just done.
func (c *tableCache[T]) refreshForMiss(ctx context.Context) (T, error) {
	return c.getOlderThan(ctx, min(assetsMissInterval, c.refresh))
}

// invalidate makes the next lookup read the tables: this process's own
// additions (POST /admin/networks, /admin/assets) are seen at once. The
// copy held is kept, to serve if that reading fails.
func (c *tableCache[T]) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loadedAt = time.Time{}
}

// held returns the copy as it is, without reading the table.
func (c *tableCache[T]) held() (T, bool) {
	if v := c.current.Load(); v != nil {
		return *v, true
	}
	var zero T
	return zero, false
}

func (c *tableCache[T]) getOlderThan(ctx context.Context, age time.Duration) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	held, ok := c.held()
	if ok && c.now().Sub(c.loadedAt) < age {
		return held, nil
	}
	loaded, err := c.load(ctx)
	if err != nil {
		if ok {
			// Serve the old copy and wait a full interval before trying
			// again, so an outage does not cost every request a reload.
			c.loadedAt = c.now()
			return held, nil
		}
		return loaded, err
	}
	c.current.Store(&loaded)
	c.loadedAt = c.now()
	return loaded, nil
}

// providerTransfers decodes a provider's delivery against the registry,
// and once more against a fresh read of it when the cached copy knew no
// listing (or network) for one of its transfers: a token or network
// another replica or settlectl added within REGISTRY_REFRESH is credited
// now, not answered ignored, which ends the provider's retries for good.
// Misses reload at most every assetsMissInterval, so a stream of unlisted
// (spam) tokens or unmapped networks costs little.
func (s *Server) providerTransfers(ctx context.Context, decode func(*payment.Registry) ([]payment.ReportedTransfer, []payment.Ignored)) ([]payment.ReportedTransfer, []payment.Ignored, error) {
	// Refresh the reports the intake reads (hasReportedRPC) without a
	// context; unread, no network counts as reported.
	_, _ = s.rpcReports.get(ctx)
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

// hasReportedRPC tells whether a worker reported an RPC on network, as
// last read; a failed read counts as no report.
func (s *Server) hasReportedRPC(network string) bool {
	reported, _ := s.rpcReports.held()
	return reported[network]
}
