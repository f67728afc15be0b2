//go:build !fuzzing

package chain

import (
	"context"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// Long enough that a held probe never times out on a loaded machine.
const heldCallTimeout = 30 * time.Second

// failUntilOpen makes calls alternate between workers until one of them
// opens the breaker, and checks it took exactly errorsMax calls that all
// reached the node.
func failUntilOpen(t *testing.T, p *proxy, workers ...*worker) {
	t.Helper()
	_ = lastFailureBeforeOpen(t, p, workers...) // checked inside
}

// lastFailureBeforeOpen is failUntilOpen returning the last call's error,
// for the tests that check what ended it.
func lastFailureBeforeOpen(t *testing.T, p *proxy, workers ...*worker) error {
	t.Helper()
	ctx := testContext(t)
	var before int64
	if p != nil {
		before = p.requests.Load()
	}
	var err error
	for i := range BreakerErrorsMaxDefault {
		err = workers[i%len(workers)].latest(ctx)
		require.ErrorIs(t, err, payment.ErrUnavailable)
		require.False(t, isBreakerOpen(err), "call %d was refused; the breaker opened early", i+1)
	}
	if p != nil {
		require.Equal(t, before+BreakerErrorsMaxDefault, p.requests.Load())
	}
	return err
}

// requireRejected checks that every worker refuses calls without
// reaching the node.
func requireRejected(t *testing.T, p *proxy, calls int, workers ...*worker) {
	t.Helper()
	ctx := testContext(t)
	before := p.requests.Load()
	for range calls {
		for _, w := range workers {
			err := w.latest(ctx)
			require.ErrorIs(t, err, ErrBreakerOpen)
			require.ErrorIs(t, err, payment.ErrUnavailable)
		}
	}
	require.Equal(t, before, p.requests.Load(), "a call reached the node while the breaker was open")
}

func alertsRaised(key string, workers ...*worker) int {
	n := 0
	for _, w := range workers {
		n += w.alerts.count(key)
	}
	return n
}

// concurrentCalls starts n calls on each worker at once and returns their
// errors on a channel as they finish.
func concurrentCalls(ctx context.Context, n int, workers ...*worker) <-chan error {
	results := make(chan error, n*len(workers))
	for _, w := range workers {
		for range n {
			go func() { results <- w.latest(ctx) }()
		}
	}
	return results
}

// TestBreakerSharedAcrossWorkers: two workers (separate Redis clients,
// registries and alerters) share one breaker. Five errors between them
// open it for both, and exactly one of them alerts; while open nothing
// reaches the node; in half-open exactly one of twenty concurrent callers
// gets through as the probe; its success closes the breaker for both,
// and exactly one alerts that.
func TestBreakerSharedAcrossWorkers(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	redisURL := testenv.RedisURL(t)
	opts := workerOptions{redisURL: redisURL, breaker: testBreaker, callTimeout: heldCallTimeout}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)
	ctx := testContext(t)

	require.NoError(t, a.latest(ctx))
	require.NoError(t, b.latest(ctx))

	p.setMode(proxyFail)
	failUntilOpen(t, p, a, b)
	require.Equal(t, 1, alertsRaised(AlertBreakerOpen, a, b), "exactly one worker opened it")
	requireRejected(t, p, 20, a, b)
	require.EqualValues(t, stateGaugeOpen, metricValue(t, a.client.metrics.state))
	require.EqualValues(t, stateGaugeOpen, metricValue(t, b.client.metrics.state))

	// The open period ends; the node is back but slow: the probe is held
	// at the proxy while everyone else asks.
	p.setMode(proxyPass)
	release := p.hold()
	defer release()
	expireOpen(t, a)
	before := p.requests.Load()
	const callersPerWorker = 10
	results := concurrentCalls(ctx, callersPerWorker, a, b)
	for range 2*callersPerWorker - 1 {
		select {
		case err := <-results:
			require.ErrorIs(t, err, ErrBreakerOpen, "only the probe may pass in half-open")
		case <-ctx.Done():
			t.Fatal("callers were not refused while the probe was out")
		}
	}
	require.Eventually(t, func() bool { return p.requests.Load() == before+1 }, testTimeout, testPollInterval)
	release()
	select {
	case err := <-results:
		require.NoError(t, err, "the probe")
	case <-ctx.Done():
		t.Fatal("the probe did not finish")
	}
	require.Equal(t, before+1, p.requests.Load(), "exactly one probe went out")
	require.Equal(t, 1, alertsRaised(AlertBreakerClosed, a, b))

	for range 3 {
		require.NoError(t, a.latest(ctx))
		require.NoError(t, b.latest(ctx))
	}
	require.EqualValues(t, stateGaugeClosed, metricValue(t, a.client.metrics.state))
	require.EqualValues(t, stateGaugeClosed, metricValue(t, b.client.metrics.state))
	transitions := func(to string) float64 {
		return metricValue(t, a.client.metrics.transitions.WithLabelValues(to, storeRedis)) +
			metricValue(t, b.client.metrics.transitions.WithLabelValues(to, storeRedis))
	}
	require.EqualValues(t, 1, transitions("open"))
	require.EqualValues(t, 1, transitions("half_open"))
	require.EqualValues(t, 1, transitions("closed"))
	require.EqualValues(t, 2*20+2*callersPerWorker-1, metricValue(t, a.client.metrics.rejected)+metricValue(t, b.client.metrics.rejected))
}

// TestBreakerProbeFailureReopens: a failed probe opens the breaker for
// another full period, and the next caller after it becomes the probe.
func TestBreakerProbeFailureReopens(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	opts := workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)
	ctx := testContext(t)

	p.setMode(proxyFail)
	failUntilOpen(t, p, a, b)
	expireOpen(t, b)

	before := p.requests.Load()
	err := b.latest(ctx)
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.False(t, isBreakerOpen(err), "the probe reached the node")
	require.Equal(t, before+1, p.requests.Load())
	ttl, err := a.rdb.PTTL(ctx, a.client.breaker.keys[keyOpen]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, testBreaker.OpenFor-time.Minute, "re-opened for a full period")
	require.Equal(t, 2, alertsRaised(AlertBreakerOpen, a, b), "opened, then re-opened")
	requireRejected(t, p, 5, a, b)

	p.setMode(proxyPass)
	expireOpen(t, a)
	require.NoError(t, a.latest(ctx))
	require.NoError(t, b.latest(ctx))
	require.Equal(t, 1, alertsRaised(AlertBreakerClosed, a, b))
}

// TestBreakerEndpointDown: a closed port opens the breaker for both
// workers; once the port is back and the real open period has passed, a
// probe closes it. No test-side expiry here: Redis's TTL does it.
func TestBreakerEndpointDown(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	settings := testBreaker
	settings.OpenFor = time.Second
	opts := workerOptions{redisURL: testenv.RedisURL(t), breaker: settings}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)
	ctx := testContext(t)

	p.down()
	failUntilOpen(t, nil, a, b)
	err := a.latest(ctx)
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.Equal(t, 1, alertsRaised(AlertBreakerOpen, a, b))

	p.up()
	require.Eventually(t, func() bool { return a.latest(ctx) == nil }, testTimeout, 50*time.Millisecond)
	require.NoError(t, b.latest(ctx))
	require.Equal(t, 1, alertsRaised(AlertBreakerClosed, a, b))
}

// TestBreakerEndpointHanging: a node that never answers fails each call
// at the call deadline, and five of those open the breaker.
func TestBreakerEndpointHanging(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	opts := workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker, callTimeout: 200 * time.Millisecond}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)
	ctx := testContext(t)

	p.setMode(proxyHang)
	err := lastFailureBeforeOpen(t, p, a, b)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the call deadline ended it")
	requireRejected(t, p, 5, a, b)

	p.setMode(proxyPass)
	expireOpen(t, a)
	require.NoError(t, b.latest(ctx))
	require.NoError(t, a.latest(ctx))
}

// TestBreakerIgnoresWhatSaysNothingAboutTheNode: not-found answers are
// successes, a caller's own cancellation is neither success nor failure,
// and a probe whose caller gave up frees the slot for the next caller.
func TestBreakerIgnoresWhatSaysNothingAboutTheNode(t *testing.T) {
	c := startChain(t)
	require.NoError(t, c.CommitBlocks(testContext(t), 1)) // lets the tx indexer finish
	p := newProxy(t, c.URL())
	w := newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker})
	ctx := testContext(t)

	for range 2 * BreakerErrorsMaxDefault {
		require.Eventually(t, func() bool {
			_, err := w.client.Receipt(ctx, "0x"+strings.Repeat("ab", 32))
			return errors.Is(err, ErrReceiptNotFound)
		}, testTimeout, testPollInterval)
		_, err := w.client.HeaderByNumber(ctx, 1_000_000)
		require.ErrorIs(t, err, ErrBlockNotFound)
	}

	p.setMode(proxyHang)
	for range 2 * BreakerErrorsMaxDefault {
		callerCtx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := w.latest(callerCtx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	p.setMode(proxyPass)
	require.NoError(t, w.latest(ctx), "the breaker is still closed")

	p.setMode(proxyFail)
	failUntilOpen(t, p, w)
	expireOpen(t, w)
	p.setMode(proxyHang)
	probeCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	require.ErrorIs(t, w.latest(probeCtx), context.DeadlineExceeded, "the probe went out and its caller gave up")
	cancel()
	probeHeld, err := w.rdb.Exists(ctx, w.client.breaker.keys[keyProbe]).Result()
	require.NoError(t, err)
	require.Zero(t, probeHeld, "the abandoned probe freed its slot")
	p.setMode(proxyPass)
	require.NoError(t, w.latest(ctx), "the next caller became the probe at once")
}

// TestBreakerStaleOutcome: an outcome from a call that began before the
// breaker changed state does not move it.
func TestBreakerStaleOutcome(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	a := newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker})
	ctx := testContext(t)

	slow, err := a.client.breaker.allow(ctx) // a call that will end late
	require.NoError(t, err)
	p.setMode(proxyFail)
	failUntilOpen(t, p, a)
	expireOpen(t, a)
	probe, err := a.client.breaker.allow(ctx)
	require.NoError(t, err)
	require.True(t, probe.probe)

	a.client.breaker.report(ctx, slow, outcomeSuccess, nil)
	_, err = a.client.breaker.allow(ctx)
	require.ErrorIs(t, err, ErrBreakerOpen, "a stale success did not close it")
	a.client.breaker.report(ctx, probe, outcomeSuccess, nil)
	_, err = a.client.breaker.allow(ctx)
	require.NoError(t, err, "the probe's success did")
}

// TestBreakerFallbackWhenRedisDown: with Redis stopped, each worker's
// in-process gobreaker takes over with the same thresholds: five errors
// open it, nothing passes while open, one probe per process in half-open,
// and its success closes it. When Redis is back, the shared breaker
// decides again.
func TestBreakerFallbackWhenRedisDown(t *testing.T) {
	ctx := testContext(t)
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(rds.Close)
	c := startChain(t)
	p := newProxy(t, c.URL())
	settings := testBreaker
	// gobreaker reads the wall clock, so the open period is real; calls on
	// the fallback take microseconds, so 3s leaves a wide margin. Redis is
	// not retried within the test's lifetime unless the test says so.
	settings.OpenFor = 3 * time.Second
	settings.RedisRetryAfter = time.Hour
	opts := workerOptions{redisURL: rds.URL(0), breaker: settings, callTimeout: heldCallTimeout}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)

	require.NoError(t, a.latest(ctx))
	require.NoError(t, b.latest(ctx))
	rds.Stop()

	p.setMode(proxyFail)
	for _, w := range []*worker{a, b} {
		failUntilOpen(t, p, w)
		require.EqualValues(t, 1, metricValue(t, w.client.metrics.fallback))
		require.Equal(t, 1, w.alerts.count(AlertBreakerOpen), "each process alerts for its own breaker")
		require.EqualValues(t, 1, metricValue(t, w.client.metrics.transitions.WithLabelValues("open", storeInProcess)))

		before := p.requests.Load()
		var errs []error
		for range 10 {
			errs = append(errs, w.latest(ctx))
		}
		// Open only ever turns half-open with time: still open now means
		// open throughout.
		if w.client.breaker.local.State() != gobreaker.StateOpen {
			t.Log("the machine was too slow to check the open period; skipped that check")
			continue
		}
		for _, err := range errs {
			require.ErrorIs(t, err, ErrBreakerOpen)
		}
		require.Equal(t, before, p.requests.Load(), "a call reached the node while the breaker was open")
	}

	p.setMode(proxyPass)
	release := p.hold()
	defer release()
	for _, w := range []*worker{a, b} {
		require.Eventually(t, func() bool { return w.client.breaker.local.State() == gobreaker.StateHalfOpen }, testTimeout, 50*time.Millisecond)
	}
	before := p.requests.Load()
	const callersPerWorker = 10
	results := concurrentCalls(ctx, callersPerWorker, a, b)
	for range 2*callersPerWorker - 2 {
		select {
		case err := <-results:
			require.ErrorIs(t, err, ErrBreakerOpen)
		case <-ctx.Done():
			t.Fatal("callers were not refused while the probes were out")
		}
	}
	require.Eventually(t, func() bool { return p.requests.Load() == before+2 }, testTimeout, testPollInterval)
	release()
	for range 2 {
		select {
		case err := <-results:
			require.NoError(t, err, "a probe")
		case <-ctx.Done():
			t.Fatal("the probes did not finish")
		}
	}
	require.Equal(t, before+2, p.requests.Load(), "one probe per process")
	for _, w := range []*worker{a, b} {
		require.Equal(t, 1, w.alerts.count(AlertBreakerClosed))
		require.NoError(t, w.latest(ctx))
	}

	require.NoError(t, rds.Start(ctx))
	for _, w := range []*worker{a, b} {
		w.client.breaker.redis.retryAt.Store(0) // as if RedisRetryAfter had passed
		require.Eventually(t, func() bool {
			return w.latest(ctx) == nil && metricValue(t, w.client.metrics.fallback) == 0
		}, testTimeout, 50*time.Millisecond)
	}
}

// TestBreakerWithoutRedis: with no Redis configured at all, the in-process
// breaker is the breaker.
func TestBreakerWithoutRedis(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	w := newWorker(t, p.URL(), workerOptions{breaker: testBreaker})
	p.setMode(proxyFail)
	failUntilOpen(t, p, w)
	requireRejected(t, p, 5, w)
	require.Equal(t, 1, w.alerts.count(AlertBreakerOpen))
}

// TestErrorsHideTheEndpointSecret: providers put the API key in the
// URL; it must not reach error text (logs, alerts, DLQ rows).
func TestErrorsHideTheEndpointSecret(t *testing.T) {
	p := newProxy(t, "http://127.0.0.1:1")
	p.down()
	w := newWorker(t, "http://user:hunter2@"+p.addr+"/v3/SECRETKEY?key=SECRETQUERY", workerOptions{breaker: testBreaker})
	err := w.latest(testContext(t))
	require.ErrorIs(t, err, payment.ErrUnavailable)
	var urlErr *url.Error
	require.ErrorAs(t, err, &urlErr, "the chain is kept")
	for _, secret := range []string{"hunter2", "SECRETKEY", "SECRETQUERY"} {
		require.NotContains(t, err.Error(), secret)
	}
	require.Contains(t, err.Error(), p.addr)
}

func TestDialRejects(t *testing.T) {
	ctx := testContext(t)
	for _, raw := range []string{"", "localhost:8545", "ws://localhost:8546", "ftp://x", "http://"} {
		_, err := Dial(ctx, raw, ClientOptions{})
		require.Error(t, err, raw)
	}
	_, err := Dial(ctx, "http://localhost:8545", ClientOptions{CallTimeout: time.Minute, Breaker: BreakerSettings{ProbeTTL: 10 * time.Second}})
	require.ErrorContains(t, err, "probe TTL")
}

// TestProbeTTLFollowsTheCallTimeout: without a probe TTL of its own, the
// probe slot outlasts the call timeout and the report after it, so a
// longer ETH_RPC_TIMEOUT starts (and still lets one probe out at a time).
func TestProbeTTLFollowsTheCallTimeout(t *testing.T) {
	for _, c := range []struct{ call, probe time.Duration }{
		{CallTimeoutDefault, BreakerProbeTTLDefault},
		{8 * time.Second, BreakerProbeTTLDefault},
		{8*time.Second + time.Millisecond, 10*time.Second + time.Millisecond},
		{9 * time.Second, 11 * time.Second},
		{15 * time.Second, 17 * time.Second},
	} {
		client, err := Dial(testContext(t), "http://localhost:8545", ClientOptions{CallTimeout: c.call})
		require.NoError(t, err, "call timeout %s", c.call)
		require.Equal(t, c.probe, client.breaker.settings.ProbeTTL, "call timeout %s", c.call)
		require.GreaterOrEqual(t, client.breaker.settings.ProbeTTL, c.call+2*breakerRedisTimeout)
		client.Close()
	}
}

// TestBreakerOpenCreditsNothingFromTheCache: a final deposit whose
// receipt is cached is checked again while the breaker is open: the
// cache would answer without the node, but nothing is credited while the
// breaker is open (unavailable, no call made). Half-open, the cache
// answers again without taking the probe slot.
func TestBreakerOpenCreditsNothingFromTheCache(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	w := newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t), breaker: testBreaker})
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	advanceTo(t, c, 2)
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	d := Deposit{TxHash: tx.Hash, Recipients: []string{to}, Amount: big.NewInt(1_000)}
	require.Equal(t, Credit, check(t, w, d, FinalizedPolicy()).State)
	require.NoError(t, w.client.BreakerOpen(ctx))

	p.setMode(proxyFail)
	failUntilOpen(t, p, w)
	before := p.requests.Load()
	v, err := w.checker.CheckDeposit(ctx, d, FinalizedPolicy())
	require.ErrorIs(t, err, ErrBreakerOpen, "while the breaker is open nothing is credited; got %s (%s)", v.State, v.Reason)
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.Equal(t, before, p.requests.Load(), "no call reached the node")

	p.setMode(proxyPass)
	expireOpen(t, w)
	require.Equal(t, Credit, check(t, w, d, FinalizedPolicy()).State, "half-open: the cache answers")
	require.Equal(t, before, p.requests.Load())
	_, err = w.client.breaker.allowShared(ctx)
	require.NoError(t, err, "the probe slot is still free")
}

// TestBreakerOpenWithoutRedis: with Redis unreachable, whether the
// breaker is open is the in-process breaker's word.
func TestBreakerOpenWithoutRedis(t *testing.T) {
	ctx := testContext(t)
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(rds.Close)
	c := startChain(t)
	p := newProxy(t, c.URL())
	w := newWorker(t, p.URL(), workerOptions{redisURL: rds.URL(0), breaker: testBreaker})
	require.NoError(t, w.client.BreakerOpen(ctx))
	rds.Stop()
	require.NoError(t, w.client.BreakerOpen(ctx), "Redis failed: the in-process breaker is closed")
	require.EqualValues(t, 1, metricValue(t, w.client.metrics.fallback))

	p.setMode(proxyFail)
	failUntilOpen(t, p, w)
	w.client.breaker.redis.retryAt.Store(0) // Redis asked again, and failing again
	require.ErrorIs(t, w.client.BreakerOpen(ctx), ErrBreakerOpen)
	require.ErrorIs(t, w.client.BreakerOpen(ctx), ErrBreakerOpen, "and while Redis is not asked")
}
