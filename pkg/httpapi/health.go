package httpapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// readyCheckTimeout bounds each dependency check of /readyz, so a probe
// answers well within a load balancer's timeout.
const readyCheckTimeout = 2 * time.Second

// Redis probe bounds: one ping per redisProbeEvery at most, however often
// /healthz is probed and /metrics scraped, each within redisProbeTimeout.
const (
	redisProbeEvery   = time.Second
	redisProbeTimeout = time.Second
)

type healthJSON struct {
	Status string `json:"status"`
	// Redis is "ok" or "unreachable", also in settle_redis_up (and in
	// /readyz unless READY_WITHOUT_REDIS).
	Redis   string `json:"redis"`
	TraceID string `json:"trace_id"`
}

// healthz says the process is alive, with Redis's state as detail.
func (s *Server) healthz(c echo.Context) error {
	redisState := "ok"
	if !s.redisUp.up(c.Request().Context()) {
		redisState = "unreachable"
	}
	return c.JSON(http.StatusOK, healthJSON{Status: "ok", Redis: redisState, TraceID: TraceID(c.Request().Context())})
}

type readyJSON struct {
	Status  string            `json:"status,omitempty"`
	Error   string            `json:"error,omitempty"`
	Code    string            `json:"code,omitempty"`
	Checks  map[string]string `json:"checks"`
	TraceID string            `json:"trace_id"`
}

// readyz says whether this replica can do its job: PostgreSQL and Redis
// answer and the schema is current, as the contract defines readiness.
// With READY_WITHOUT_REDIS, Redis is left out: ingest needs only
// PostgreSQL (the rate limit and the replay guard fall back to
// in-process), so a Redis outage then takes no api out of its Service.
// It fails while shutting down, so new work goes elsewhere while requests
// in flight finish.
func (s *Server) readyz(c echo.Context) error {
	ctx := c.Request().Context()
	checks := map[string]string{"postgres": "ok", "migrations": "current"}
	ready := !s.stopping.Load()
	if !ready {
		checks["server"] = "shutting_down"
	}
	if !s.readyWithoutRedis {
		checks["redis"] = "ok"
		if !s.redisUp.up(ctx) {
			checks["redis"], ready = "unreachable", false
		}
	}

	pingCtx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
	err := s.store.Ping(pingCtx)
	cancel()
	if err != nil {
		checks["postgres"], checks["migrations"], ready = "unreachable", "unknown", false
	} else {
		schemaCtx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
		current, err := s.store.SchemaCurrent(schemaCtx)
		cancel()
		switch {
		case err != nil:
			checks["migrations"], ready = "unknown", false
		case !current:
			checks["migrations"], ready = "pending", false
		}
	}

	traceID := TraceID(ctx)
	if !ready {
		return c.JSON(http.StatusServiceUnavailable, readyJSON{Error: "not ready", Code: CodeUnavailable, Checks: checks, TraceID: traceID})
	}
	return c.JSON(http.StatusOK, readyJSON{Status: "ready", Checks: checks, TraceID: traceID})
}

// redisProbe remembers whether Redis answered a recent ping, so neither
// probes nor scrapes can multiply the pings.
type redisProbe struct {
	client    redis.UniversalClient
	mu        sync.Mutex
	checkedAt time.Time
	ok        bool
}

// newRedisProbe registers settle_redis_up, read from the probe at scrape.
func newRedisProbe(client redis.UniversalClient, reg prometheus.Registerer) *redisProbe {
	p := &redisProbe{client: client}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "settle_redis_up", Help: "1 when Redis answered the api's last ping (checked at most once a second), else 0.",
	}, func() float64 {
		if p.up(context.Background()) {
			return 1
		}
		return 0
	}))
	return p
}

func (p *redisProbe) up(ctx context.Context) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.checkedAt.IsZero() && time.Since(p.checkedAt) < redisProbeEvery {
		return p.ok
	}
	ctx, cancel := context.WithTimeout(ctx, redisProbeTimeout)
	defer cancel()
	p.ok = p.client.Ping(ctx).Err() == nil
	p.checkedAt = time.Now()
	return p.ok
}
