package httpapi

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

// TestReplayClaimLeftInFlightExpiresSoon: an api killed (or panicking)
// while it handles a delivery never ends its claim. The claim must not
// outlast the handling bound: held for the whole window, it would refuse
// the provider's retries with 503 until their timestamp is too old to be
// taken at all, and the delivery would be lost. A claim ended done lasts
// the whole window.
func TestReplayClaimLeftInFlightExpiresSoon(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	g := newReplayGuard(rdb, time.Second, 10*time.Minute, zerolog.Nop(), prometheus.NewRegistry())
	require.Equal(t, writeTimeout, g.inFlight, "premise: a claim in flight lasts the server's write timeout")
	g.inFlight = 300 * time.Millisecond // the same rule, at test speed

	for _, local := range []bool{false, true} {
		if local {
			g.redisRetryAt.Store(time.Now().Add(time.Hour).UnixNano()) // as after a Redis failure
		}
		abandoned := replayKey("test", []byte("nonce-a"), []byte("1"), []byte("body"))
		_, state, err := g.claim(ctx, abandoned)
		require.NoError(t, err)
		require.Equal(t, replayNew, state)
		_, state, err = g.claim(ctx, abandoned)
		require.NoError(t, err)
		require.Equal(t, replayInFlight, state, "local=%v", local)

		finished := replayKey("test", []byte("nonce-b"), []byte("1"), []byte("body"))
		c, state, err := g.claim(ctx, finished)
		require.NoError(t, err)
		require.Equal(t, replayNew, state)
		g.settle(ctx, c, true)

		time.Sleep(2 * g.inFlight)
		_, state, err = g.claim(ctx, abandoned)
		require.NoError(t, err)
		require.Equal(t, replayNew, state, "local=%v: an abandoned claim still refuses the retry", local)
		_, state, err = g.claim(ctx, finished)
		require.NoError(t, err)
		require.Equal(t, replaySeen, state, "local=%v: a delivery answered 2xx is remembered for the window", local)
	}
}
