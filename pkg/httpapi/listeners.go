package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
)

// publicListenerKey marks a request that came in on the public listener
// while a separate admin listener (ADMIN_ADDR) exists.
type publicListenerKey struct{}

// adminOnly reports whether a route template belongs to the admin
// listener when there is one: the operator's surface, never the
// internet's.
func adminOnly(route string) bool {
	return route == "/metrics" || route == "/openapi.yaml" || strings.HasPrefix(route, "/admin/")
}

// listenerMiddleware runs after routing: on the public listener, an admin
// route answers as if it did not exist (404 not_found), whatever its
// method, before any authentication is attempted.
func (s *Server) listenerMiddleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if public, _ := c.Request().Context().Value(publicListenerKey{}).(bool); public && adminOnly(c.Path()) {
			return newError(http.StatusNotFound, "not found")
		}
		return next(c)
	}
}

// publicHandler serves the public listener of a split server.
func (s *Server) publicHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.echo.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), publicListenerKey{}, true)))
	})
}

// ServeSplit is Serve with the admin routes, /metrics and /openapi.yaml
// on their own listener (ADMIN_ADDR): public answers them 404, admin
// serves everything. A nil admin serves everything on public.
func (s *Server) ServeSplit(ctx context.Context, public, admin net.Listener, shutdownTimeout time.Duration) error {
	servers := []*http.Server{s.httpServer(s)}
	listeners := []net.Listener{public}
	if admin != nil {
		servers = []*http.Server{s.httpServer(s.publicHandler()), s.httpServer(s)}
		listeners = append(listeners, admin)
	}
	served := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { served <- srv.Serve(listeners[i]) }()
	}
	var failed error
	select {
	case err := <-served:
		failed = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// /readyz now fails, so a load balancer stops sending new work while
	// the requests in flight finish.
	s.stopping.Store(true)
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	shutdownErrs := make([]error, len(servers))
	var cutOff atomic.Bool
	for i, srv := range servers {
		wg.Go(func() {
			err := srv.Shutdown(stopCtx)
			if err == nil {
				return
			}
			_ = srv.Close()
			if errors.Is(err, context.DeadlineExceeded) {
				// Requests still running at SHUTDOWN_TIMEOUT (anyone can
				// hold one by sending a body slowly) lose nothing by being
				// cut: a webhook is committed before its 200, so the
				// sender retries whatever it was not told was accepted.
				cutOff.Store(true)
				return
			}
			shutdownErrs[i] = fmt.Errorf("shutdown: %w", err)
		})
	}
	wg.Wait()
	if cutOff.Load() {
		s.log.Warn().Dur("shutdown_timeout", shutdownTimeout).Msg("requests still running at SHUTDOWN_TIMEOUT were cut off; their senders retry")
	}
	if failed != nil {
		return failed
	}
	if err := errors.Join(shutdownErrs...); err != nil {
		return err
	}
	for range servers {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	return nil
}

func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    headerBytesMax,
	}
}
