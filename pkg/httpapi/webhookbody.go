package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// Bounds of the bodies read before their signature is checked.
const (
	// UnverifiedBytesMaxDefault bounds the bytes that requests not yet
	// verified may hold at once across the process
	// (INGEST_UNVERIFIED_BYTES_MAX).
	UnverifiedBytesMaxDefault = 64 << 20
	// UnverifiedClientBytesMaxDefault is the part of it one client (an
	// IPv4 address or an IPv6 /64) may hold (INGEST_UNVERIFIED_CLIENT_BYTES_MAX):
	// two provider bodies at the default limit, so one attacker cannot
	// take the whole budget from the providers sharing it. A client
	// holding nothing may always take one request's reservation, whatever
	// this says.
	UnverifiedClientBytesMaxDefault = 8 << 20
	// bodyReservationMin is the least a request reserves, so empty bodies
	// still count and the table of clients stays bounded (at most the
	// budget over this).
	bodyReservationMin = 4 << 10
	// bodyBufferInitial is the first buffer of a body; it doubles as bytes
	// arrive, up to the reservation, so a slow sender holds only what it
	// sent.
	bodyBufferInitial = 16 << 10
	// retryAfterBusy is what a caller refused for a full budget waits: the
	// budget frees as soon as bodies in flight are verified or fail.
	retryAfterBusy = 1
)

// UnverifiedClientShareDefault is a client's share when none is set: two
// provider bodies (a gzip body's wire bytes and what they inflate to),
// never less than UnverifiedClientBytesMaxDefault nor more than the
// budget.
func UnverifiedClientShareDefault(providerBodyMax, budget int64) int64 {
	return min(max(UnverifiedClientBytesMaxDefault, 2*providerBodyMax), budget)
}

// unverifiedBytes is the shared budget of unverified body bytes: a
// weighted semaphore that never queues (a request that does not fit is
// refused at once), with a share per client.
type unverifiedBytes struct {
	total     int64
	clientMax int64

	mu      sync.Mutex
	held    int64
	clients map[string]int64

	inFlight prometheus.Gauge
	refused  *prometheus.CounterVec
}

func newUnverifiedBytes(total, clientMax int64, reg prometheus.Registerer) *unverifiedBytes {
	b := &unverifiedBytes{
		total: total, clientMax: clientMax, clients: map[string]int64{},
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_api_unverified_body_bytes",
			Help: "Bytes reserved by webhook bodies whose signature is not checked yet (bounded by INGEST_UNVERIFIED_BYTES_MAX).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_api_unverified_budget_refused_total",
			Help: "Webhooks refused with 503 before their body was read, because the unverified byte budget (why=total) or the client's share of it (why=client) was full.",
		}, []string{"why"}),
	}
	reg.MustRegister(b.inFlight, b.refused)
	return b
}

// reserve takes n bytes for client, or reports false without waiting.
func (b *unverifiedBytes) reserve(client string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.total {
		b.refused.WithLabelValues("total").Inc()
		return false
	}
	if held := b.clients[client]; held > 0 && held+n > b.clientMax {
		b.refused.WithLabelValues("client").Inc()
		return false
	}
	b.held += n
	b.clients[client] += n
	b.inFlight.Set(float64(b.held))
	return true
}

func (b *unverifiedBytes) release(client string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if b.clients[client] -= n; b.clients[client] <= 0 {
		delete(b.clients, client)
	}
	b.inFlight.Set(float64(b.held))
}

// verifier checks a body's signature; it sees the request for its headers.
type verifier func(r *http.Request, body []byte) bool

// readSigned reads a webhook body of at most limit bytes and checks its
// signature before anything else looks at it, for any provider route:
//
//   - a declared length over limit is refused before a byte is read;
//   - the read reserves its size (the declared length, else limit) from
//     the unverified budget, and is refused at once (503, Retry-After)
//     when the budget or the client's share is full: never queued;
//   - a request that ends without a good signature (missing, wrong, too
//     large, cut off) counts against WEBHOOK_RATE_LIMIT; a verified one
//     against WEBHOOK_VERIFIED_RATE_LIMIT.
//
// The server's ReadTimeout bounds how long a slow sender holds its share.
// Refusals are counted under source.
func (s *Server) readSigned(c echo.Context, source string, limit int64, verify verifier) ([]byte, error) {
	return s.readSignedDecoded(c, source, limit, nil, verify)
}

// decoder turns the bytes on the wire into the signed body (a gzip
// body's uncompressed bytes), at most limit of them; nil when the route
// takes no encoding. It calls grow before its output buffer takes more
// memory, and stops with errUnverifiedBusy when grow says no.
type decoder func(r *http.Request, wire []byte, limit int64, grow func(n int64) bool) ([]byte, error)

// errUnverifiedBusy: the unverified budget (or the client's share) had no
// room for a decoded body's next bytes.
var errUnverifiedBusy = errors.New("unverified body budget full")

// readSignedDecoded is readSigned for a route whose provider signs the
// decoded body: decode runs before verify, its output is bounded by the
// same limit, and the reservation covers both buffers: the wire bytes up
// front, the decoded ones as the decoder's buffer grows (never the whole
// limit ahead of bytes that actually decompress), all released when the
// signature has been checked.
func (s *Server) readSignedDecoded(c echo.Context, source string, limit int64, decode decoder, verify verifier) ([]byte, error) {
	r := c.Request()
	ctx := r.Context()
	client := clientKey(ClientIP(ctx))
	if r.ContentLength > limit {
		dropConnection(c)
		s.chargeUnverified(c, client)
		if over := s.overUnverifiedLimit(c, source); over != nil {
			return nil, over
		}
		s.metrics.webhook(source, outcomeRejected, "body_too_large")
		return nil, bodyError(errBodyTooLarge)
	}
	reservation := limit
	if r.ContentLength >= 0 {
		reservation = r.ContentLength
	}
	reservation = max(reservation, bodyReservationMin)
	if !s.unverified.reserve(client, reservation) {
		dropConnection(c)
		return nil, s.unverifiedBusy(source)
	}
	body, err := readLimited(r.Body, limit, r.ContentLength)
	if err == nil && decode != nil {
		body, err = decode(r, body, limit, func(n int64) bool {
			if !s.unverified.reserve(client, n) {
				return false
			}
			reservation += n
			return true
		})
	}
	verified := err == nil && verify(r, body)
	s.unverified.release(client, reservation)
	if errors.Is(err, errUnverifiedBusy) {
		// Refused for room, like a request that found the budget full
		// before its body: not charged as a failed signature.
		return nil, s.unverifiedBusy(source)
	}
	if !verified {
		s.chargeUnverified(c, client)
		if over := s.overUnverifiedLimit(c, source); over != nil {
			return nil, over
		}
		if err != nil {
			answer := bodyError(err)
			s.metrics.webhook(source, outcomeRejected, reasonOf(answer))
			return nil, answer
		}
		s.metrics.webhook(source, outcomeRejected, "signature")
		return nil, fail(errSignature, "")
	}
	if s.verifiedLimit != nil {
		if verdict := s.verifiedLimit.allow(ctx, client); !verdict.allowed {
			s.metrics.webhook(source, outcomeRejected, "rate_limited")
			return nil, s.rateLimited(c, verdict)
		}
	}
	return body, nil
}

// unverifiedBusy is the answer to a request the unverified budget has no
// room for: 503 with Retry-After, counted under source.
func (s *Server) unverifiedBusy(source string) error {
	s.metrics.webhook(source, outcomeRejected, "busy")
	answer := newError(http.StatusServiceUnavailable, "too many unverified webhooks in flight, retry later")
	answer.retryAfter = retryAfterBusy
	return answer
}

// dropConnection closes the connection after an answer sent without
// reading the body: otherwise net/http would wait to discard up to 256 KiB
// of it first (as slowly as the sender likes) before the answer goes out.
func dropConnection(c echo.Context) {
	c.Response().Header().Set(echo.HeaderConnection, "close")
}

// chargeUnverified counts a request that did not prove its signature.
func (s *Server) chargeUnverified(c echo.Context, client string) {
	if s.unverifiedLimit != nil {
		s.unverifiedLimit.allow(c.Request().Context(), client)
	}
}

// readLimited reads a whole body of at most limit bytes. The buffer grows
// with what arrives and never past the declared length (or limit) plus
// the one byte that tells a body over limit: memory follows bytes sent.
func readLimited(r io.Reader, limit, declared int64) ([]byte, error) {
	return readLimitedGrowing(r, limit, declared, nil)
}

// readLimitedGrowing is readLimited asking grow (when not nil) for every
// byte of buffer capacity before taking it: errUnverifiedBusy when refused.
func readLimitedGrowing(r io.Reader, limit, declared int64, grow func(n int64) bool) ([]byte, error) {
	bound := limit + 1
	if declared >= 0 && declared < limit {
		bound = declared + 1
	}
	first := min(bound, bodyBufferInitial)
	if grow != nil && !grow(first) {
		return nil, errUnverifiedBusy
	}
	buf := make([]byte, 0, first)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == bound {
				break
			}
			size := min(bound, 2*int64(cap(buf)))
			if grow != nil && !grow(size-int64(cap(buf))) {
				return nil, errUnverifiedBusy
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				return nil, errBodyTooLarge
			}
			return nil, fmt.Errorf("read body: %w", err)
		}
	}
	if int64(len(buf)) > limit {
		return nil, errBodyTooLarge
	}
	return buf, nil
}
