//go:build !fuzzing

package chain

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

// TestReadBreakerState follows a real breaker shared through Redis:
// closed, open after the errors, half-open once the open period ends.
func TestReadBreakerState(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	w := newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker, callTimeout: heldCallTimeout})
	ctx := testContext(t)
	require.Equal(t, breakerKeyPrefix(BreakerNameDefault)+"tripped", w.client.breaker.keys[keyTripped])

	require.NoError(t, w.latest(ctx))
	state, err := ReadBreakerState(ctx, w.rdb, "")
	require.NoError(t, err)
	require.Equal(t, BreakerClosed, state)

	p.setMode(proxyFail)
	failUntilOpen(t, p, w)
	state, err = ReadBreakerState(ctx, w.rdb, BreakerNameDefault)
	require.NoError(t, err)
	require.Equal(t, BreakerOpen, state)

	expireOpen(t, w)
	state, err = ReadBreakerState(ctx, w.rdb, BreakerNameDefault)
	require.NoError(t, err)
	require.Equal(t, BreakerHalfOpen, state)

	other, err := ReadBreakerState(ctx, w.rdb, "another-endpoint")
	require.NoError(t, err)
	require.Equal(t, BreakerClosed, other, "breakers of other names share nothing")
}
