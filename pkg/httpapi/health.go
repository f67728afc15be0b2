package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// readyCheckTimeout bounds each dependency check of /readyz, so a probe
// answers well within a load balancer's timeout.
const readyCheckTimeout = 2 * time.Second

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok", "trace_id": TraceID(c.Request().Context())})
}

type readyJSON struct {
	Status  string            `json:"status,omitempty"`
	Error   string            `json:"error,omitempty"`
	Code    string            `json:"code,omitempty"`
	Checks  map[string]string `json:"checks"`
	TraceID string            `json:"trace_id"`
}

// readyz says whether this replica should get traffic: PostgreSQL and
// Redis answer and the schema is current. It fails while shutting down,
// so new work goes elsewhere while requests in flight finish.
func (s *Server) readyz(c echo.Context) error {
	ctx := c.Request().Context()
	checks := map[string]string{"postgres": "ok", "migrations": "current", "redis": "ok"}
	ready := !s.stopping.Load()
	if !ready {
		checks["server"] = "shutting_down"
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

	redisCtx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
	err = s.redis.Ping(redisCtx).Err()
	cancel()
	if err != nil {
		checks["redis"], ready = "unreachable", false
	}

	traceID := TraceID(ctx)
	if !ready {
		return c.JSON(http.StatusServiceUnavailable, readyJSON{Error: "not ready", Code: CodeUnavailable, Checks: checks, TraceID: traceID})
	}
	return c.JSON(http.StatusOK, readyJSON{Status: "ready", Checks: checks, TraceID: traceID})
}
