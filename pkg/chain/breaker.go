package chain

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/sony/gobreaker/v2"

	"github.com/settle/settle/pkg/alert"
)

// The seed's breaker thresholds: 5 errors within 30s open the breaker for
// 60s; then exactly one caller across all workers probes, holding the
// probe slot for at most 10s (longer when the call timeout needs it: see
// probeTTLFor).
const (
	BreakerErrorsMaxDefault   = 5
	BreakerErrorWindowDefault = 30 * time.Second
	BreakerOpenForDefault     = 60 * time.Second
	BreakerProbeTTLDefault    = 10 * time.Second
	// BreakerRedisRetryAfterDefault: after Redis failed, the in-process
	// breaker decides alone (and the finality cache is skipped) this long
	// before Redis is asked again.
	BreakerRedisRetryAfterDefault = 5 * time.Second
	BreakerNameDefault            = "eth"

	// breakerRedisTimeout bounds each breaker round trip to Redis; past
	// it the call goes on under the in-process breaker.
	breakerRedisTimeout = time.Second
	// fallbackBuckets: the in-process breaker counts errors in a rolling
	// window of this many buckets, so "5 errors within 30s" slides by 1s.
	fallbackBuckets = 30
	// tokenBytes of randomness name one call in Redis (probe owner, error
	// window member).
	tokenBytes = 16
)

// Alert keys; the alerter rate-limits per key.
const (
	AlertBreakerOpen   = "chain_rpc_breaker_open"
	AlertBreakerClosed = "chain_rpc_breaker_closed"
)

// Alerter is where the breaker tells a human; *alert.Alerter satisfies it.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// BreakerSettings are the breaker's thresholds. Zero fields take the
// defaults above; tests shorten them, production keeps the seed's values.
type BreakerSettings struct {
	// Name namespaces the Redis keys, so breakers of different endpoints
	// do not share state.
	Name            string
	ErrorsMax       int
	ErrorWindow     time.Duration
	OpenFor         time.Duration
	ProbeTTL        time.Duration
	RedisRetryAfter time.Duration
}

func (s BreakerSettings) withDefaults() BreakerSettings {
	if s.Name == "" {
		s.Name = BreakerNameDefault
	}
	if s.ErrorsMax <= 0 {
		s.ErrorsMax = BreakerErrorsMaxDefault
	}
	if s.ErrorWindow <= 0 {
		s.ErrorWindow = BreakerErrorWindowDefault
	}
	if s.OpenFor <= 0 {
		s.OpenFor = BreakerOpenForDefault
	}
	if s.ProbeTTL <= 0 {
		s.ProbeTTL = BreakerProbeTTLDefault
	}
	if s.RedisRetryAfter <= 0 {
		s.RedisRetryAfter = BreakerRedisRetryAfterDefault
	}
	return s
}

// Shared state, one Redis key each (hash-tagged so that a cluster keeps
// them in one slot, which the scripts need):
//
//	tripped     exists while the breaker is open or half-open
//	open        exists while open; its TTL is the rest of the open period
//	probe       token of the one caller let through in half-open; TTL ProbeTTL
//	generation  bumped on every transition, so the outcome of a call that
//	            began in an earlier state cannot move the current one
//	errors      sorted set of recent failures scored by Redis time in ms
//
// Closed = no tripped; open = tripped and open; half-open = tripped
// without open. Redis time, not the workers' clocks, measures the window.
const (
	keyTripped = iota
	keyOpen
	keyProbe
	keyGeneration
	keyErrors
	keyCount
)

// Decisions of allowScript.
const (
	decisionAllow        = 0
	decisionRejectOpen   = 1
	decisionProbe        = 2
	decisionRejectProbed = 3
)

// allowScript runs before a call ("may I call?").
//
// KEYS[1] tripped, KEYS[2] open, KEYS[3] probe, KEYS[4] generation
// ARGV[1] probe TTL in milliseconds
// ARGV[2] the caller's token
// Result: {decision, generation}; decision is 0 allow (closed), 1 reject
// (open), 2 allow as the probe (half-open; this caller now owns KEYS[3]),
// 3 reject (half-open and another caller holds the probe).
var allowScript = redis.NewScript(`
local generation = tonumber(redis.call('GET', KEYS[4]) or '0')
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, generation}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {1, generation}
end
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[1]) then
  return {2, generation}
end
return {3, generation}
`)

// Results of reportScript.
const (
	reportRecorded = 0
	reportOpened   = 1
	reportClosed   = 2
	reportReopened = 3
	reportStale    = 4
)

// reportScript runs after a call ("this is how it went").
//
// KEYS[1] tripped, KEYS[2] open, KEYS[3] probe, KEYS[4] generation, KEYS[5] errors
// ARGV[1] outcome: "success", "failure", or "ignore" (the caller gave up
//
//	before the node answered, which says nothing about the node)
//
// ARGV[2] the generation allowScript returned to this caller
// ARGV[3] the caller's token
// ARGV[4] error window in milliseconds
// ARGV[5] errors within the window that open the breaker
// ARGV[6] open period in milliseconds
// Result: 0 recorded, no transition; 1 this failure opened the breaker;
// 2 this probe succeeded and closed it; 3 this probe failed and re-opened
// it; 4 stale, the breaker changed state since the call began.
// Exactly one caller gets 1 (or 2, or 3) per transition, so exactly one
// process alerts.
var reportScript = redis.NewScript(`
local generation = tonumber(redis.call('GET', KEYS[4]) or '0')
if redis.call('GET', KEYS[3]) == ARGV[3] then
  if ARGV[1] == 'success' then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[5])
    redis.call('INCR', KEYS[4])
    return 2
  end
  if ARGV[1] == 'failure' then
    redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
    redis.call('DEL', KEYS[3])
    redis.call('INCR', KEYS[4])
    return 3
  end
  redis.call('DEL', KEYS[3])
  return 0
end
if tonumber(ARGV[2]) ~= generation then
  return 4
end
if ARGV[1] ~= 'failure' or redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[4]))
redis.call('ZADD', KEYS[5], now, ARGV[3])
redis.call('PEXPIRE', KEYS[5], ARGV[4])
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[5]) then
  redis.call('SET', KEYS[1], '1')
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
  redis.call('DEL', KEYS[5])
  redis.call('INCR', KEYS[4])
  return 1
end
return 0
`)

type outcome int

const (
	outcomeSuccess outcome = iota + 1
	outcomeFailure
	// outcomeIgnore: the caller gave up; neither success nor failure.
	outcomeIgnore
)

func (o outcome) String() string {
	switch o {
	case outcomeSuccess:
		return "success"
	case outcomeFailure:
		return "failure"
	}
	return "ignore"
}

// Errors fed to the in-process breaker to carry an outcome.
var (
	errOutcomeFailure = errors.New("rpc call failed")
	errOutcomeIgnore  = errors.New("rpc call abandoned by its caller")
)

// breaker guards RPC calls. Its state lives in Redis so that every worker
// sees the same breaker; the Redis round trips happen before and after a
// call, never around it, so calls of different workers (and of one
// worker's goroutines) run concurrently. While Redis is unreachable, an
// in-process gobreaker with the same thresholds decides.
type breaker struct {
	settings BreakerSettings
	rdb      redis.UniversalClient // nil: the in-process breaker only
	keys     []string
	local    *gobreaker.TwoStepCircuitBreaker[struct{}]
	metrics  *clientMetrics
	alerter  Alerter
	log      zerolog.Logger

	// redis says when Redis may be asked again after a failure; until
	// then the in-process breaker decides alone.
	redis      *redisLatch
	onFallback atomic.Bool
}

// redisLatch remembers a Redis failure for a while, so that an
// unreachable Redis costs one timeout per period instead of one per call.
type redisLatch struct {
	period  time.Duration
	retryAt atomic.Int64 // unix ns
}

func (l *redisLatch) usable() bool { return time.Now().UnixNano() >= l.retryAt.Load() }

func (l *redisLatch) failed() { l.retryAt.Store(time.Now().Add(l.period).UnixNano()) }

// ticket is what allow hands the caller to report with.
type ticket struct {
	store      string
	generation int64
	token      string
	probe      bool
	localDone  func(error)
}

func newBreaker(settings BreakerSettings, rdb redis.UniversalClient, metrics *clientMetrics, alerter Alerter, log zerolog.Logger) *breaker {
	b := &breaker{settings: settings, rdb: rdb, metrics: metrics, alerter: alerter, log: log, redis: &redisLatch{period: settings.RedisRetryAfter}}
	prefix := "settle:chain:breaker:{" + settings.Name + "}:"
	b.keys = make([]string, keyCount)
	b.keys[keyTripped] = prefix + "tripped"
	b.keys[keyOpen] = prefix + "open"
	b.keys[keyProbe] = prefix + "probe"
	b.keys[keyGeneration] = prefix + "generation"
	b.keys[keyErrors] = prefix + "errors"

	bucket := max(settings.ErrorWindow/fallbackBuckets, time.Millisecond)
	errorsMax := uint32(settings.ErrorsMax)
	b.local = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:          settings.Name,
		MaxRequests:   1,
		Interval:      settings.ErrorWindow,
		BucketPeriod:  bucket,
		Timeout:       settings.OpenFor,
		ReadyToTrip:   func(c gobreaker.Counts) bool { return c.TotalFailures >= errorsMax },
		IsExcluded:    func(err error) bool { return errors.Is(err, errOutcomeIgnore) },
		OnStateChange: b.localTransition,
	})
	return b
}

// allow asks whether a call may go out. A refusal is ErrBreakerOpen; any
// other error means the caller's context ended.
func (b *breaker) allow(ctx context.Context) (ticket, error) {
	if b.rdb != nil && b.redis.usable() {
		t, err := b.allowShared(ctx)
		if err == nil || errors.Is(err, ErrBreakerOpen) {
			b.leaveFallback(ctx)
			return t, err
		}
		b.redisFailed(ctx, "allow", err)
	}
	return b.allowLocal()
}

// isOpen tells, without taking a ticket, whether the breaker is open: an
// answer that needs no call (a cached one) asks it, since while the
// breaker is open nothing is credited. Half-open is not open: its probe
// decides. A Redis failure leaves the in-process breaker to say.
func (b *breaker) isOpen(ctx context.Context) bool {
	if b.rdb != nil && b.redis.usable() {
		redisCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), breakerRedisTimeout)
		defer cancel()
		n, err := b.rdb.Exists(redisCtx, b.keys[keyOpen]).Result()
		if err == nil {
			b.leaveFallback(ctx)
			return n == 1
		}
		b.redisFailed(ctx, "state", err)
	}
	return b.local.State() == gobreaker.StateOpen
}

func (b *breaker) allowShared(ctx context.Context) (ticket, error) {
	token, err := newToken()
	if err != nil {
		return ticket{}, err
	}
	// Not the caller's context: a probe slot granted while the caller
	// gives up must still reach us, or it would sit unused for ProbeTTL.
	// The call then fails at once on the caller's context, and reporting
	// that frees the slot.
	redisCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), breakerRedisTimeout)
	defer cancel()
	raw, err := allowScript.Run(redisCtx, b.rdb, b.keys[:keyErrors], b.settings.ProbeTTL.Milliseconds(), token).Int64Slice()
	if err != nil {
		return ticket{}, fmt.Errorf("breaker allow script: %w", err)
	}
	if len(raw) != 2 {
		return ticket{}, fmt.Errorf("breaker allow script returned %d values, want 2", len(raw))
	}
	t := ticket{store: storeRedis, generation: raw[1], token: token}
	switch raw[0] {
	case decisionAllow:
		b.metrics.state.Set(stateGaugeClosed)
		return t, nil
	case decisionProbe:
		b.metrics.state.Set(stateGaugeHalfOpen)
		b.metrics.transitions.WithLabelValues("half_open", storeRedis).Inc()
		zerolog.Ctx(ctx).Info().Msg("ethereum rpc breaker half-open: this call is the probe")
		t.probe = true
		return t, nil
	case decisionRejectOpen:
		b.metrics.state.Set(stateGaugeOpen)
	case decisionRejectProbed:
		b.metrics.state.Set(stateGaugeHalfOpen)
	default:
		return ticket{}, fmt.Errorf("breaker allow script returned decision %d", raw[0])
	}
	b.metrics.rejected.Inc()
	return ticket{}, ErrBreakerOpen
}

func (b *breaker) allowLocal() (ticket, error) {
	done, err := b.local.Allow()
	if err != nil {
		b.metrics.rejected.Inc()
		b.metrics.state.Set(localStateGauge(b.local.State()))
		return ticket{}, ErrBreakerOpen
	}
	return ticket{store: storeInProcess, localDone: done}, nil
}

// report records how an allowed call went. callErr feeds the alert.
func (b *breaker) report(ctx context.Context, t ticket, o outcome, callErr error) {
	if t.store == storeInProcess {
		t.localDone(outcomeError(o))
		return
	}
	// The outcome is recorded even when the caller's context has ended:
	// a probe that is never reported would hold the slot until its TTL.
	redisCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), breakerRedisTimeout)
	defer cancel()
	result, err := reportScript.Run(redisCtx, b.rdb, b.keys,
		o.String(), t.generation, t.token,
		b.settings.ErrorWindow.Milliseconds(), b.settings.ErrorsMax, b.settings.OpenFor.Milliseconds(),
	).Int64()
	if err != nil {
		b.redisFailed(ctx, "report", fmt.Errorf("breaker report script: %w", err))
		// Redis lost this outcome; the in-process breaker, which decides
		// until Redis is back, keeps it.
		if done, err := b.local.Allow(); err == nil {
			done(outcomeError(o))
		}
		return
	}
	switch result {
	case reportOpened:
		b.opened(ctx, storeRedis, "errors reached the threshold", callErr)
	case reportReopened:
		b.opened(ctx, storeRedis, "the half-open probe failed", callErr)
	case reportClosed:
		b.closed(ctx, storeRedis)
	case reportRecorded, reportStale:
	default:
		zerolog.Ctx(ctx).Error().Int64("result", result).Msg("ethereum rpc breaker report script returned an unknown result")
	}
}

func (b *breaker) opened(ctx context.Context, store, why string, callErr error) {
	b.metrics.state.Set(stateGaugeOpen)
	b.metrics.transitions.WithLabelValues("open", store).Inc()
	fields := map[string]any{
		"store": store, "reason": why,
		"errors_max": b.settings.ErrorsMax, "error_window": b.settings.ErrorWindow.String(), "open_for": b.settings.OpenFor.String(),
	}
	if callErr != nil {
		fields["last_error"] = callErr.Error()
	}
	zerolog.Ctx(ctx).Warn().Fields(fields).Msg("ethereum rpc breaker opened")
	b.raise(AlertBreakerOpen, alert.Critical, "Ethereum RPC circuit breaker opened ("+why+"); chain checks fail fast and deposits wait", fields)
}

func (b *breaker) closed(ctx context.Context, store string) {
	b.metrics.state.Set(stateGaugeClosed)
	b.metrics.transitions.WithLabelValues("closed", store).Inc()
	zerolog.Ctx(ctx).Info().Str("store", store).Msg("ethereum rpc breaker closed")
	b.raise(AlertBreakerClosed, alert.Warning, "Ethereum RPC circuit breaker closed: a probe call succeeded", map[string]any{"store": store})
}

func (b *breaker) raise(key string, severity alert.Severity, summary string, fields map[string]any) {
	if b.alerter != nil {
		b.alerter.Raise(key, severity, summary, fields)
	}
}

// localTransition is gobreaker's OnStateChange; it runs under gobreaker's
// lock, and Raise never blocks.
func (b *breaker) localTransition(_ string, from, to gobreaker.State) {
	b.metrics.state.Set(localStateGauge(to))
	switch to {
	case gobreaker.StateOpen:
		why := "errors reached the threshold"
		if from == gobreaker.StateHalfOpen {
			why = "the half-open probe failed"
		}
		b.metrics.transitions.WithLabelValues("open", storeInProcess).Inc()
		b.log.Warn().Str("store", storeInProcess).Str("reason", why).Msg("ethereum rpc breaker opened")
		b.raise(AlertBreakerOpen, alert.Critical, "Ethereum RPC circuit breaker opened ("+why+", in-process fallback while Redis is unreachable); chain checks fail fast and deposits wait",
			map[string]any{"store": storeInProcess, "reason": why, "errors_max": b.settings.ErrorsMax, "error_window": b.settings.ErrorWindow.String(), "open_for": b.settings.OpenFor.String()})
	case gobreaker.StateHalfOpen:
		b.metrics.transitions.WithLabelValues("half_open", storeInProcess).Inc()
	case gobreaker.StateClosed:
		b.metrics.transitions.WithLabelValues("closed", storeInProcess).Inc()
		b.log.Info().Str("store", storeInProcess).Msg("ethereum rpc breaker closed")
		b.raise(AlertBreakerClosed, alert.Warning, "Ethereum RPC circuit breaker closed: a probe call succeeded (in-process fallback)", map[string]any{"store": storeInProcess})
	}
}

func (b *breaker) redisFailed(ctx context.Context, op string, err error) {
	b.metrics.redisFailure.WithLabelValues("breaker_" + op).Inc()
	b.redis.failed()
	if b.onFallback.CompareAndSwap(false, true) {
		b.metrics.fallback.Set(1)
		b.metrics.state.Set(localStateGauge(b.local.State()))
		zerolog.Ctx(ctx).Warn().Err(err).Str("retry_after", b.settings.RedisRetryAfter.String()).
			Msg("ethereum rpc breaker: Redis unreachable, using the in-process breaker")
	}
}

func (b *breaker) leaveFallback(ctx context.Context) {
	if b.onFallback.CompareAndSwap(true, false) {
		b.metrics.fallback.Set(0)
		zerolog.Ctx(ctx).Info().Msg("ethereum rpc breaker: Redis reachable again, using the shared breaker")
	}
}

func outcomeError(o outcome) error {
	switch o {
	case outcomeSuccess:
		return nil
	case outcomeFailure:
		return errOutcomeFailure
	}
	return errOutcomeIgnore
}

func localStateGauge(s gobreaker.State) float64 {
	switch s {
	case gobreaker.StateOpen:
		return stateGaugeOpen
	case gobreaker.StateHalfOpen:
		return stateGaugeHalfOpen
	}
	return stateGaugeClosed
}

func newToken() (string, error) {
	buf := make([]byte, tokenBytes)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("breaker token: %w", err)
	}
	return hex.EncodeToString(buf), nil
}
