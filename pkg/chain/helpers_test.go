//go:build !fuzzing

package chain

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/testenv"
)

// Generous bounds: the tests run on a loaded two-core machine.
const (
	testTimeout      = 2 * time.Minute
	testPollInterval = 10 * time.Millisecond
	proxyRelistenMax = 50
)

func TestMain(m *testing.M) { testenv.Main(m) }

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func startChain(t testing.TB) *devchain.Chain {
	t.Helper()
	c, err := devchain.Serve(testContext(t), devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// proxyMode says what the proxy does with a request.
type proxyMode int32

const (
	proxyPass proxyMode = iota // forward to the chain
	proxyFail                  // answer 502 at once
	proxyHang                  // never answer; the client's deadline ends it
	proxyHold                  // wait for release, then forward
)

// proxy stands between a checker and the chain: it counts every request
// that reaches it and can fail, hang, hold or go down (a closed port).
type proxy struct {
	t        testing.TB
	addr     string
	forward  *httputil.ReverseProxy
	mode     atomic.Int32
	requests atomic.Int64

	mu      sync.Mutex
	server  *http.Server
	release chan struct{}
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, addr: l.Addr().String(), forward: httputil.NewSingleHostReverseProxy(u), release: make(chan struct{})}
	p.serve(l)
	t.Cleanup(p.down)
	return p
}

func (p *proxy) URL() string { return "http://" + p.addr }

func (p *proxy) setMode(m proxyMode) { p.mode.Store(int32(m)) }

// hold makes requests wait until the returned release is called.
func (p *proxy) hold() (release func()) {
	p.mu.Lock()
	ch := make(chan struct{})
	p.release = ch
	p.mu.Unlock()
	p.setMode(proxyHold)
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	switch proxyMode(p.mode.Load()) {
	case proxyFail:
		http.Error(w, "upstream unavailable", http.StatusBadGateway)
		return
	case proxyHang:
		<-r.Context().Done()
		return
	case proxyHold:
		p.mu.Lock()
		ch := p.release
		p.mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
	}
	p.forward.ServeHTTP(w, r)
}

func (p *proxy) serve(l net.Listener) {
	server := &http.Server{Handler: p, ReadHeaderTimeout: testTimeout}
	p.mu.Lock()
	p.server = server
	p.mu.Unlock()
	go func() { _ = server.Serve(l) }()
}

// down closes the port: connections are refused until up.
func (p *proxy) down() {
	p.mu.Lock()
	server := p.server
	p.server = nil
	p.mu.Unlock()
	if server != nil {
		_ = server.Close()
	}
}

// up listens on the same port again.
func (p *proxy) up() {
	p.t.Helper()
	var lastErr error
	for range proxyRelistenMax {
		l, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.serve(l)
			return
		}
		lastErr = err
		time.Sleep(testPollInterval)
	}
	p.t.Fatalf("proxy: listen on %s again: %v", p.addr, lastErr)
}

// recordingAlerter stands in for *alert.Alerter.
type recordingAlerter struct {
	mu     sync.Mutex
	raised map[string]int
}

func (a *recordingAlerter) Raise(key string, _ alert.Severity, _ string, _ map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.raised == nil {
		a.raised = map[string]int{}
	}
	a.raised[key]++
}

func (a *recordingAlerter) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.raised[key]
}

// worker is one process's view: its own Redis client, registry, alerter.
type worker struct {
	checker *Checker
	client  *Client
	alerts  *recordingAlerter
	rdb     redis.UniversalClient
}

type workerOptions struct {
	redisURL    string // empty: no Redis at all
	callTimeout time.Duration
	breaker     BreakerSettings
	notFinalTTL time.Duration // 0: hints off (most tests re-check at once)
}

// testBreaker keeps the seed's 5 errors in 30s, opens "forever" (tests
// end the open period themselves, see expireOpen) and hands the probe
// slot out for longer than any test call takes.
var testBreaker = BreakerSettings{OpenFor: time.Hour, ProbeTTL: time.Minute, RedisRetryAfter: 100 * time.Millisecond}

func newWorker(t testing.TB, rpcURL string, o workerOptions) *worker {
	t.Helper()
	w := &worker{alerts: &recordingAlerter{}}
	if o.redisURL != "" {
		opts, err := redis.ParseURL(o.redisURL)
		require.NoError(t, err)
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, time.Second, time.Second
		w.rdb = redis.NewClient(opts)
		t.Cleanup(func() { _ = w.rdb.Close() })
	}
	if o.notFinalTTL == 0 {
		o.notFinalTTL = -1
	}
	reg := prometheus.NewRegistry()
	client, err := Dial(testContext(t), rpcURL, ClientOptions{
		Redis: w.rdb, Registerer: reg, Alerter: w.alerts, CallTimeout: o.callTimeout, Breaker: o.breaker,
	})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	w.client = client
	w.checker = NewChecker(client, CheckerOptions{Redis: w.rdb, Registerer: reg, NotFinalTTL: o.notFinalTTL, RedisRetryAfter: o.breaker.RedisRetryAfter})
	return w
}

// latest asks for the latest header: the simplest breaker-guarded call.
func (w *worker) latest(ctx context.Context) error {
	_, err := w.client.HeaderByTag(ctx, TagLatest)
	return err
}

// expireOpen ends the shared open period now, as the passing of OpenFor
// would, so tests neither sleep for it nor race it.
func expireOpen(t testing.TB, w *worker) {
	t.Helper()
	n, err := w.rdb.Del(testContext(t), w.client.breaker.keys[keyOpen]).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the breaker was not open")
}

func isBreakerOpen(err error) bool { return errors.Is(err, ErrBreakerOpen) }

// metricValue reads one counter or gauge.
func metricValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	close(ch)
	m, ok := <-ch
	require.True(t, ok, "no metric collected")
	var pb dto.Metric
	require.NoError(t, m.Write(&pb))
	switch {
	case pb.Counter != nil:
		return pb.Counter.GetValue()
	case pb.Gauge != nil:
		return pb.Gauge.GetValue()
	}
	t.Fatalf("metric is neither a counter nor a gauge")
	return 0
}
