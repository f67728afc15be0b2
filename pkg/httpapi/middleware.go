package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/tracing"
)

// Headers that carry a trace id in, and the one that carries it out.
const (
	HeaderRequestID        = "X-Request-ID"
	HeaderAlchemyRequestID = "X-Alchemy-Request-ID"
)

// traceIDLengthMax bounds a caller's trace id: it is stored with the
// event and written into every log line the event causes.
const traceIDLengthMax = 128

type contextKey int

const (
	traceIDKey contextKey = iota
	clientIPKey
	pathParamsKey
)

// TraceID is the request's trace id ("" outside a request).
func TraceID(ctx context.Context) string {
	id, _ := ctx.Value(traceIDKey).(string)
	return id
}

// ClientIP is the request's client address as TRUSTED_PROXIES decides it.
func ClientIP(ctx context.Context) netip.Addr {
	ip, _ := ctx.Value(clientIPKey).(netip.Addr)
	return ip
}

// validTraceID accepts printable ASCII without spaces, bounded: anything
// else could forge log lines or bloat the event row.
func validTraceID(s string) bool {
	if s == "" || len(s) > traceIDLengthMax {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// traceMiddleware runs first: it settles the trace id and echoes an id
// on every response, and puts the trace id, the client address, a logger
// stamped with it and the request's span into the request context. The
// trace id is the caller's X-Request-ID, else a valid traceparent's
// trace-id, else a new UUID (the contract) whose hex digits are the W3C
// trace id the tracing UI shows. A traceparent always
// continues the caller's OpenTelemetry trace. X-Request-ID echoes the
// trace id.
func (s *Server) traceMiddleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		requestID := ""
		for _, header := range []string{HeaderRequestID, HeaderAlchemyRequestID} {
			if candidate := r.Header.Get(header); validTraceID(candidate) {
				requestID = candidate
				break
			}
		}
		ctx, parentID := tracing.Continue(r.Context(), r.Header.Get(tracing.HeaderTraceparent))
		// The caller's X-Request-ID is the trace_id (the contract); the
		// OpenTelemetry trace goes on under the traceparent regardless.
		id := requestID
		if id == "" {
			id = parentID
		}
		if id == "" {
			id = tracing.NewRequestID()
		}
		if parentID == "" {
			ctx = tracing.WithTraceID(ctx, id)
		}
		if requestID == "" {
			requestID = id
		}
		c.Response().Header().Set(HeaderRequestID, requestID)
		span := trace.SpanFromContext(ctx) // does nothing: ended below
		if !s.quietRoutes[r.URL.Path] {    // probes and scrapes are no one's trace
			ctx, span = tracing.Start(ctx, "http.request", tracing.Server)
		}
		ctx = context.WithValue(ctx, traceIDKey, id)
		ctx = context.WithValue(ctx, clientIPKey, s.proxies.ClientIP(r))
		ctx = logging.WithTrace(ctx, s.log, id)
		c.SetRequest(r.WithContext(ctx))
		err := next(c)
		if span.IsRecording() {
			// Named after the route only now: Pre middleware runs before routing.
			route := c.Path()
			if !s.routes[route] {
				route = routeUnmatched
			}
			status := c.Response().Status
			span.SetName(r.Method + " " + route)
			span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route),
				attribute.Int("http.response.status_code", status))
			if status >= http.StatusInternalServerError {
				span.SetStatus(codes.Error, http.StatusText(status))
			}
		}
		span.End()
		return err
	}
}

// observeMiddleware measures and logs every request by its route
// template. It writes errors itself (instead of leaving that to echo
// after the chain) so that it sees the final status.
func (s *Server) observeMiddleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		procs.Active() // a request ends the GOMAXPROCS controller's idle period
		if err := next(c); err != nil {
			s.handleError(err, c)
		}
		route := c.Path()
		if !s.routes[route] {
			route = routeUnmatched // unknown paths must not grow the label set
		}
		status := c.Response().Status
		elapsed := time.Since(start)
		s.metrics.observeRequest(c.Request().Method, route, status, elapsed)

		level := zerolog.InfoLevel
		switch {
		case status >= http.StatusInternalServerError:
			level = zerolog.ErrorLevel
		case s.quietRoutes[route]:
			level = zerolog.DebugLevel
		}
		logging.From(c.Request().Context()).WithLevel(level).
			Str("method", c.Request().Method).Str("route", route).Int("status", status).
			Dur("duration", elapsed).Str("client_ip", ClientIP(c.Request().Context()).String()).
			Msg("request")
		return nil
	}
}

// recoverMiddleware turns a panic into a logged 500, so one bad request
// cannot take the process down.
func (s *Server) recoverMiddleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if recovered := recover(); recovered != nil {
				if err, ok := recovered.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(recovered)
				}
				logging.From(c.Request().Context()).Error().
					Str("panic", fmt.Sprint(recovered)).Bytes("stack", debug.Stack()).
					Msg("handler panicked")
				s.metrics.panics.Inc()
				err = newError(http.StatusInternalServerError, "internal error")
			}
		}()
		return next(c)
	}
}

// tokenDigest is what tokens are compared by: equal-length digests, so
// the comparison leaks neither content nor length.
type tokenDigest [sha256.Size]byte

func digest(token string) tokenDigest { return sha256.Sum256([]byte(token)) }

func matchesAny(given string, accepted []tokenDigest) bool {
	d := digest(given)
	matched := 0
	for _, a := range accepted {
		matched |= subtle.ConstantTimeCompare(d[:], a[:])
	}
	return matched == 1
}

// requireToken admits requests bearing one of the accepted tokens. With
// basicAuth, HTTP Basic with the token as password is accepted too, since
// a browser cannot add a bearer header.
func (s *Server) requireToken(basicAuth bool, accepted ...tokenDigest) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			header := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, credentials, _ := strings.Cut(header, " ")
			credentials = strings.TrimSpace(credentials)
			ok := false
			switch {
			case strings.EqualFold(scheme, "Bearer"):
				ok = credentials != "" && matchesAny(credentials, accepted)
			case basicAuth && strings.EqualFold(scheme, "Basic"):
				if decoded, err := base64.StdEncoding.DecodeString(credentials); err == nil {
					_, password, found := strings.Cut(string(decoded), ":")
					ok = found && password != "" && matchesAny(password, accepted)
				}
			}
			if !ok {
				challenge(c.Response().Header(), basicAuth)
				s.metrics.authFailures.Inc()
				return fail(errUnauthorized, "missing or invalid token")
			}
			return next(c)
		}
	}
}

// challenge asks for credentials, one scheme per WWW-Authenticate line:
// a browser offers its login only when Basic has a line of its own
// (Chromium ignores a Basic listed after another scheme in one line).
func challenge(h http.Header, basicAuth bool) {
	h.Del(echo.HeaderWWWAuthenticate)
	if basicAuth {
		h.Add(echo.HeaderWWWAuthenticate, `Basic realm="settle"`)
	}
	h.Add(echo.HeaderWWWAuthenticate, `Bearer realm="settle"`)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	w.WriteHeader(status)
	// The status is sent; a failed write means the client went away.
	_ = json.NewEncoder(w).Encode(v)
}

// SameOrigin refuses a request a browser says came from another site:
// its Origin must be this host, and without an Origin its Sec-Fetch-Site
// must not be cross-site or same-site. A client that sends neither (not a
// browser) passes. Routes that take HTTP Basic need it on every action,
// since a browser resends cached Basic credentials from any page.
func SameOrigin(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		return err == nil && (u.Scheme == "http" || u.Scheme == "https") && strings.EqualFold(u.Host, r.Host)
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return true
	}
	return false
}
