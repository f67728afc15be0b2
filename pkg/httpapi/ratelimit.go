package httpapi

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Bounds of WEBHOOK_RATE_LIMIT, WEBHOOK_VERIFIED_RATE_LIMIT and of the
// limiter's own work.
const (
	RateLimitDefault = "30/s,300/m"
	// VerifiedRateLimitDefault: signed deliveries are not limited, so a
	// provider's few egress addresses or one internal service are never
	// throttled by a per-address budget meant for strangers.
	VerifiedRateLimitDefault = "off"
	rateWindowsMax           = 4
	rateLimitMax             = 1_000_000
	rateLimitKeyPrefix       = "settle:ratelimit:"
	// rateKeyGrace keeps a counter a little past its window, so replicas
	// whose clocks differ slightly still count into the same key.
	rateKeyGrace = time.Second
	// RateLimitTimeoutDefault bounds one limiter round trip: a slow Redis
	// must not add seconds to every webhook.
	RateLimitTimeoutDefault = 250 * time.Millisecond
	// redisRetryInterval: after a Redis failure the in-process limiter is
	// used for this long before Redis is tried again, so an outage costs
	// one timeout per interval, not one per request.
	redisRetryInterval = 5 * time.Second
	// fallbackKeysMax bounds the in-process limiter's table.
	fallbackKeysMax = 100_000
	// clientIPv6PrefixBits: an IPv6 client is its /64, the smallest block
	// a site is normally given; keying whole addresses would hand every
	// holder of a /64 endless fresh budgets.
	clientIPv6PrefixBits = 64
)

// Limiter kinds, part of the Redis key so the two budgets never mix.
const (
	limitUnverified = "unverified"
	limitVerified   = "verified"
)

// clientKey is who a limit or budget counts against: an IPv4 address, or
// the /64 of an IPv6 address.
func clientKey(addr netip.Addr) string {
	if !addr.IsValid() {
		return "unknown"
	}
	addr = addr.Unmap()
	if addr.Is4() {
		return addr.String()
	}
	return netip.PrefixFrom(addr, clientIPv6PrefixBits).Masked().String()
}

// RateWindow is one "N per period" rule.
type RateWindow struct {
	Limit  int
	Period time.Duration
}

// RateLimit is the parsed WEBHOOK_RATE_LIMIT; empty means off.
type RateLimit []RateWindow

var ratePeriods = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}

// ParseRateLimit reads "30/s,300/m" (units s, m, h) or "off".
func ParseRateLimit(s string) (RateLimit, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return nil, nil
	}
	var out RateLimit
	seen := map[time.Duration]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		count, unit, ok := strings.Cut(item, "/")
		period, known := ratePeriods[unit]
		n, err := strconv.Atoi(count)
		if !ok || !known || err != nil || n < 1 || n > rateLimitMax || strings.HasPrefix(count, "+") {
			return nil, fmt.Errorf("%q is not like 30/s,300/m (units s, m, h; 1..%d) or off", item, rateLimitMax)
		}
		if seen[period] {
			return nil, fmt.Errorf("%q repeats the period /%s", item, unit)
		}
		if len(out) == rateWindowsMax {
			return nil, fmt.Errorf("more than %d windows", rateWindowsMax)
		}
		seen[period] = true
		out = append(out, RateWindow{Limit: n, Period: period})
	}
	return out, nil
}

// String renders the limit as it is configured.
func (l RateLimit) String() string {
	if len(l) == 0 {
		return "off"
	}
	parts := make([]string, len(l))
	for i, w := range l {
		unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[w.Period]
		parts[i] = fmt.Sprintf("%d/%s", w.Limit, unit)
	}
	return strings.Join(parts, ",")
}

// limitScript checks one request against every window and, when asked,
// counts it, in one atomic step so that replicas sharing Redis never
// over-admit.
//
// KEYS[i]: the counter of window i for this client and the current
// window (all keys share one {client} hash tag, so it also runs on a
// cluster).
// ARGV[1]: "1" to count the request when it is admitted, "0" only to ask.
// ARGV[2i]: the limit of window i. ARGV[2i+1]: the counter's TTL in ms.
// Returns 0 when the request is admitted (and, if asked, every counter
// incremented), or the 1-based index of the first full window (nothing
// incremented, so refused requests do not extend the block).
var limitScript = redis.NewScript(`
for i = 1, #KEYS do
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  if count >= tonumber(ARGV[2*i]) then
    return i
  end
end
if ARGV[1] == '1' then
  for i = 1, #KEYS do
    if redis.call('INCR', KEYS[i]) == 1 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2*i+1])
    end
  end
end
return 0
`)

// limiter is a fixed-window limiter per client, shared through Redis,
// with an in-process fallback. Windows are aligned to the clock, so
// replicas agree on them; at a boundary a client can get up to twice a
// window's limit, which is acceptable for abuse protection.
type limiter struct {
	kind    string // limitUnverified or limitVerified
	windows RateLimit
	redis   redis.UniversalClient
	timeout time.Duration
	now     func() time.Time
	log     zerolog.Logger
	metrics *metrics

	// redisRetryAt (unix nanoseconds) is when Redis may be tried again
	// after a failure; 0 while it is healthy.
	redisRetryAt atomic.Int64
	fallback     localCounters
}

// decision is a limiter's verdict; retryAfter is set when refused.
type decision struct {
	allowed    bool
	retryAfter time.Duration
}

// allow admits and counts one request of client, or refuses it.
func (l *limiter) allow(ctx context.Context, client string) decision {
	return l.decide(ctx, client, true)
}

// full reports whether client is over the limit already, counting nothing.
func (l *limiter) full(ctx context.Context, client string) decision {
	return l.decide(ctx, client, false)
}

func (l *limiter) decide(ctx context.Context, client string, count bool) decision {
	now := l.now()
	keys := make([]string, len(l.windows))
	countArg := "0"
	if count {
		countArg = "1"
	}
	args := make([]any, 0, 1+2*len(l.windows))
	args = append(args, countArg)
	for i, w := range l.windows {
		bucket := now.UnixNano() / int64(w.Period)
		keys[i] = fmt.Sprintf("%s%s:{%s}:%d:%d", rateLimitKeyPrefix, l.kind, client, int64(w.Period/time.Second), bucket)
		args = append(args, w.Limit, (w.Period + rateKeyGrace).Milliseconds())
	}
	full, decided := -1, false
	if retryAt := l.redisRetryAt.Load(); retryAt == 0 || now.UnixNano() >= retryAt {
		ctx, cancel := context.WithTimeout(ctx, l.timeout)
		index, err := limitScript.Run(ctx, l.redis, keys, args...).Int()
		cancel()
		if err == nil {
			if l.redisRetryAt.Swap(0) != 0 {
				l.log.Info().Msg("rate limiter: Redis is back; limits are shared again")
			}
			full, decided = index-1, true
		} else if l.redisRetryAt.Swap(now.Add(redisRetryInterval).UnixNano()) == 0 {
			l.log.Warn().Err(err).Msg("rate limiter: Redis unreachable; limiting in process until it is back")
		}
	}
	if !decided {
		l.metrics.rateLimitFallback.Inc()
		full = l.fallback.allow(keys, l.windows, now, count)
	}
	if full < 0 {
		return decision{allowed: true}
	}
	period := l.windows[full].Period
	windowEnd := time.Unix(0, (now.UnixNano()/int64(period)+1)*int64(period))
	return decision{retryAfter: windowEnd.Sub(now)}
}

// localCounters is the in-process fallback: the same fixed windows,
// counted per replica (so during a Redis outage each replica admits up to
// the limit on its own, rather than refusing everything).
type localCounters struct {
	mu      sync.Mutex
	entries map[string]localCounter
}

type localCounter struct {
	count     int
	expiresAt time.Time
}

// allow returns -1 when admitted (counted if count), else the index of the
// full window.
func (lc *localCounters) allow(keys []string, windows RateLimit, now time.Time, count bool) int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.entries == nil {
		lc.entries = map[string]localCounter{}
	}
	for i, key := range keys {
		if e, ok := lc.entries[key]; ok && now.Before(e.expiresAt) && e.count >= windows[i].Limit {
			return i
		}
	}
	if !count {
		return -1
	}
	if len(lc.entries)+len(keys) > fallbackKeysMax {
		for key, e := range lc.entries {
			if !now.Before(e.expiresAt) {
				delete(lc.entries, key)
			}
		}
		if len(lc.entries)+len(keys) > fallbackKeysMax {
			// Still full: forget everything rather than grow without
			// bound; the limit is briefly lenient, never unbounded memory.
			clear(lc.entries)
		}
	}
	for i, key := range keys {
		e := lc.entries[key]
		if !now.Before(e.expiresAt) {
			period := windows[i].Period
			e = localCounter{expiresAt: time.Unix(0, (now.UnixNano()/int64(period)+1)*int64(period))}
		}
		e.count++
		lc.entries[key] = e
	}
	return -1
}

// rateLimitMiddleware refuses, with 429 and Retry-After and before the
// body is read, a client whose unverified requests (signature missing or
// wrong) already fill WEBHOOK_RATE_LIMIT, when the request carries none
// of the route's signature headers. One that carries a signature is
// read and checked all the same (within the unverified byte budget): a
// verified delivery is limited only by WEBHOOK_VERIFIED_RATE_LIMIT, so a
// provider whose one misconfigured webhook spends its addresses' budget
// still delivers through the others; a signature that fails is then the
// 429 (see readSigned). It counts nothing: a request is counted only once
// its signature failed.
func (s *Server) rateLimitMiddleware(signatureHeaders ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if s.unverifiedLimit == nil {
				return next(c)
			}
			ctx := c.Request().Context()
			verdict := s.unverifiedLimit.full(ctx, clientKey(ClientIP(ctx)))
			if verdict.allowed {
				return next(c)
			}
			for _, name := range signatureHeaders {
				if c.Request().Header.Get(name) != "" {
					c.Set(contextOverUnverifiedLimit, verdict)
					return next(c)
				}
			}
			dropConnection(c)
			return s.rateLimited(c, verdict)
		}
	}
}

// contextOverUnverifiedLimit holds the refusal (a decision) of a signed
// request from a client over WEBHOOK_RATE_LIMIT, answered if its
// signature fails.
const contextOverUnverifiedLimit = "settle.over_unverified_limit"

// overUnverifiedLimit is the 429 of a request whose signature failed
// from a client already over WEBHOOK_RATE_LIMIT, or nil.
func (s *Server) overUnverifiedLimit(c echo.Context, source string) error {
	verdict, ok := c.Get(contextOverUnverifiedLimit).(decision)
	if !ok {
		return nil
	}
	dropConnection(c)
	s.metrics.webhook(source, outcomeRejected, "rate_limited")
	return s.rateLimited(c, verdict)
}

// rateLimited is the 429 of a refused request.
func (s *Server) rateLimited(c echo.Context, verdict decision) error {
	s.metrics.rateLimited.WithLabelValues(c.Path()).Inc()
	seconds := int(math.Ceil(verdict.retryAfter.Seconds()))
	if seconds < 1 {
		seconds = 1
	}
	answer := newError(http.StatusTooManyRequests, "rate limit exceeded")
	answer.retryAfter = seconds
	return answer
}
