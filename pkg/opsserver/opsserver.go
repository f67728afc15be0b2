// Package opsserver is the small HTTP server of the worker and the
// scheduler: /metrics, /healthz and /readyz on METRICS_ADDR.
package opsserver

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/logging"
)

const (
	readyTimeout      = 2 * time.Second
	readHeaderTimeout = 5 * time.Second
	requestIDMax      = 128
)

// Server serves the operational endpoints.
type Server struct {
	http *http.Server
	log  zerolog.Logger
}

// The error codes this server answers with, as the api's.
const (
	CodeUnavailable      = "unavailable"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
)

// Ready says whether the process can do its work: the state of each
// dependency by name ("postgres": "unreachable", say) and, when one is not
// fine, an error with the detail. The states are all /readyz shows: the
// port is unauthenticated, and a driver's error names users, databases
// and internal hosts.
type Ready func(context.Context) (checks map[string]string, err error)

type readyJSON struct {
	Status  string            `json:"status,omitempty"`
	Error   string            `json:"error,omitempty"`
	Code    string            `json:"code,omitempty"`
	Checks  map[string]string `json:"checks"`
	TraceID string            `json:"trace_id"`
}

// New builds a server on addr; ready reports whether the process can do
// its work (dependencies reachable, schema current).
func New(addr string, gatherer prometheus.Gatherer, ready Ready, log zerolog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		traceID := w.Header().Get("X-Request-ID")
		checks, err := ready(ctx)
		if err != nil {
			log.Warn().Err(logging.RedactError(err)).Str("trace_id", traceID).Msg("not ready")
			writeJSON(w, http.StatusServiceUnavailable, readyJSON{Error: "not ready", Code: CodeUnavailable, Checks: checks, TraceID: traceID})
			return
		}
		writeJSON(w, http.StatusOK, readyJSON{Status: "ready", Checks: checks, TraceID: traceID})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		traceID := w.Header().Get("X-Request-ID")
		// Every route takes GET (and HEAD): another method on one is a 405.
		probe := r.Clone(r.Context())
		probe.Method = http.MethodGet
		if _, pattern := mux.Handler(probe); pattern != "/" {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed", "code": CodeMethodNotAllowed, "trace_id": traceID})
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not found", "code": CodeNotFound, "trace_id": traceID})
	})
	return &Server{log: log, http: &http.Server{Addr: addr, Handler: withRequestID(mux), ReadHeaderTimeout: readHeaderTimeout}}
}

// withRequestID echoes the caller's X-Request-ID or a new one.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-ID")
		if id == "" || len(id) > requestIDMax {
			id = uuid.NewString()
		}
		w.Header().Set("X-Request-ID", id)
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// Start listens and serves in the background; the listen error (a taken
// port) is returned at once.
func (s *Server) Start() error {
	l, err := net.Listen("tcp", s.http.Addr)
	if err != nil {
		return err
	}
	go func() {
		if err := s.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("ops server stopped")
		}
	}()
	return nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.http.Addr }

// Shutdown stops the server.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }
