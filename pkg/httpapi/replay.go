package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// The replay guard of signed deliveries whose provider sends a nonce
// (QuickNode's X-QN-Nonce): a signature and a timestamp window alone let
// anyone holding a captured request send it again, byte for byte, until
// the window closes. Each verified delivery is claimed under its nonce,
// timestamp and body before it is handled; the claim becomes "done" when
// the delivery was answered 2xx and is dropped otherwise, so the
// provider's retry of a failed delivery still goes through. Claims expire
// once the timestamp could no longer pass the window.
const (
	replayKeyPrefix = "settle:replay:"
	// replayKeyGrace keeps a claim past the window as the claiming
	// replica's clock sees it, for the replicas whose clocks are behind
	// it (up to this much): they take the timestamp as fresh for longer.
	replayKeyGrace = time.Minute
	// replayDone is a claim's value once its delivery was answered 2xx.
	replayDone = "done"
	// replayFallbackKeysMax bounds the in-process table used while Redis
	// is unreachable (verified deliveries only, over one window).
	replayFallbackKeysMax = 100_000
	// replayWaitMax bounds how long a copy of a delivery in flight waits
	// for the first to end before it is answered 503 (the first's store
	// is bounded by providerStoreTimeout; a provider times out sooner).
	replayWaitMax = 10 * time.Second
	// replayWaitPoll is how often a waiting copy asks again.
	replayWaitPoll = 50 * time.Millisecond
)

// replayState is what a claim found.
type replayState int

const (
	// replayNew: the delivery was not seen; it is claimed now.
	replayNew replayState = iota
	// replaySeen: the same delivery was answered 2xx already.
	replaySeen
	// replayInFlight: the same delivery is being handled right now.
	replayInFlight
)

// errReplayTableFull: Redis is unreachable and the in-process table is
// full of live claims; the delivery cannot be checked, so it is refused.
var errReplayTableFull = errors.New("replay guard: Redis unreachable and the in-process table is full")

// claimScript sets the claim unless one exists: 1 claimed, 2 done, 3 in
// flight.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[3] then return 2 end
return 3
`)

// settleScript ends this claim (ARGV[1]): marks it done (ARGV[2] = done)
// for the whole window (ARGV[3] ms) or deletes it (ARGV[2] empty).
// Another's claim is left alone.
var settleScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`)

// replayGuard remembers claimed deliveries in Redis, shared by replicas,
// with an in-process fallback while Redis is unreachable (each replica
// then remembers what it handled itself), like the rate limiter.
type replayGuard struct {
	redis   redis.UniversalClient
	timeout time.Duration
	ttl     time.Duration
	// inFlight is how long a claim not yet ended lasts: an api killed
	// or panicking mid-delivery must not refuse the provider's retries
	// until the window closes (then they would be too old to take).
	inFlight time.Duration
	log      zerolog.Logger

	// redisRetryAt (unix nanoseconds) is when Redis may be tried again
	// after a failure; 0 while it is healthy.
	redisRetryAt atomic.Int64
	fallbacks    prometheus.Counter

	mu    sync.Mutex
	local map[string]localClaim
}

type localClaim struct {
	value     string
	expiresAt time.Time
}

func newReplayGuard(client redis.UniversalClient, timeout, window time.Duration, log zerolog.Logger, reg prometheus.Registerer) *replayGuard {
	g := &replayGuard{
		redis: client, timeout: timeout, ttl: window + replayKeyGrace, log: log,
		inFlight: min(writeTimeout, window+replayKeyGrace),
		local:    map[string]localClaim{},
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_api_replay_guard_fallback_total",
			Help: "Replay checks of signed QuickNode deliveries made in process because Redis was unreachable.",
		}),
	}
	reg.MustRegister(g.fallbacks)
	return g
}

// replayClaim is one delivery's claim, ended by settle.
type replayClaim struct {
	key, id string
	local   bool
}

// replayKey names a delivery by what its signature covers.
func replayKey(source string, parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(p))))
		h.Write(p)
	}
	return replayKeyPrefix + source + ":" + hex.EncodeToString(h.Sum(nil))
}

// claim claims the delivery key, or says who has it.
func (g *replayGuard) claim(ctx context.Context, key string) (replayClaim, replayState, error) {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	c := replayClaim{key: key, id: hex.EncodeToString(raw[:])}
	if retryAt := g.redisRetryAt.Load(); retryAt == 0 || time.Now().UnixNano() >= retryAt {
		rctx, cancel := context.WithTimeout(ctx, g.timeout)
		state, err := claimScript.Run(rctx, g.redis, []string{key}, c.id, g.inFlight.Milliseconds(), replayDone).Int()
		cancel()
		if err == nil {
			if g.redisRetryAt.Swap(0) != 0 {
				g.log.Info().Msg("replay guard: Redis is back; deliveries are remembered there again")
			}
			return c, replayState(state - 1), nil
		}
		if ctx.Err() != nil {
			// The request itself went away: not Redis's fault.
			return c, 0, ctx.Err()
		}
		if g.redisRetryAt.Swap(time.Now().Add(redisRetryInterval).UnixNano()) == 0 {
			g.log.Warn().Err(err).Msg("replay guard: Redis unreachable; remembering deliveries in process until it is back")
		}
	}
	g.fallbacks.Inc()
	c.local = true
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if e, ok := g.local[key]; ok && now.Before(e.expiresAt) {
		if e.value == replayDone {
			return c, replaySeen, nil
		}
		return c, replayInFlight, nil
	}
	if len(g.local) >= replayFallbackKeysMax {
		for k, e := range g.local {
			if !now.Before(e.expiresAt) {
				delete(g.local, k)
			}
		}
		if len(g.local) >= replayFallbackKeysMax {
			return c, 0, errReplayTableFull
		}
	}
	g.local[key] = localClaim{value: c.id, expiresAt: now.Add(g.inFlight)}
	return c, replayNew, nil
}

// claimWaiting claims key like claim, but waits for a copy of the same
// delivery in flight (a provider's retry racing the first attempt, or a
// concurrent duplicate) to end, up to replayWaitMax: it then answers
// what that copy came to (seen, or claimed now if it failed), so a
// duplicate is answered as one rather than refused.
func (g *replayGuard) claimWaiting(ctx context.Context, key string) (replayClaim, replayState, error) {
	deadline := time.Now().Add(replayWaitMax)
	for {
		c, state, err := g.claim(ctx, key)
		if err != nil || state != replayInFlight || !time.Now().Before(deadline) {
			return c, state, err
		}
		select {
		case <-ctx.Done():
			return c, state, ctx.Err()
		case <-time.After(replayWaitPoll):
		}
	}
}

// settle ends a claim: done when its delivery was answered 2xx, else
// dropped so the provider's retry is handled. It outlives the request.
func (g *replayGuard) settle(ctx context.Context, c replayClaim, done bool) {
	value := ""
	if done {
		value = replayDone
	}
	if c.local {
		g.mu.Lock()
		defer g.mu.Unlock()
		if e, ok := g.local[c.key]; ok && e.value == c.id {
			if done {
				e.value, e.expiresAt = replayDone, time.Now().Add(g.ttl)
				g.local[c.key] = e
			} else {
				delete(g.local, c.key)
			}
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	defer cancel()
	if err := settleScript.Run(ctx, g.redis, []string{c.key}, c.id, value, g.ttl.Milliseconds()).Err(); err != nil {
		// A claim left in flight refuses the same delivery with 503
		// until it expires (inFlight).
		g.log.Warn().Err(err).Bool("done", done).Msg("replay guard: could not end a claim in Redis; it expires with the window")
	}
}
