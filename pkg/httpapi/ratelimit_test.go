package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
)

// The limit is shared: two api instances on one Redis admit the limit
// between them, then both answer 429 with Retry-After. Another client is
// not affected.
func TestRateLimitSharedAcrossInstances(t *testing.T) {
	trustLoopback := func(o *httpapi.Options) {
		o.RateLimit = mustRateLimit(t, "3/h")
		proxies, err := httpapi.ParseTrustedProxies("127.0.0.1/32")
		require.NoError(t, err)
		o.TrustedProxies = proxies
	}
	a := newHarness(t, harnessOptions{change: trustLoopback})
	b := newHarness(t, harnessOptions{dsn: a.dsn, redisURL: a.redisURL, change: trustLoopback})
	a.createUser(7)

	instances := []*harness{a, b, a}
	for i, h := range instances {
		r := h.postPayment(deposit(fmt.Sprintf("shared-%d", i), 7, "1"))
		require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.raw)
	}
	for i, h := range []*harness{b, a} {
		r := h.postPayment(deposit(fmt.Sprintf("over-%d", i), 7, "1"))
		requireError(t, r, http.StatusTooManyRequests)
		// The hour window ends at 04:00:00; the clock is pinned at 03:04:05.
		require.Equal(t, "3355", r.header.Get("Retry-After"))
	}
	require.Equal(t, 3, a.countEvents(), "refused requests stored nothing")
	for _, h := range []*harness{a, b} {
		require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_rate_limited_total", map[string]string{"route": "/webhook/payments"}))
		require.Equal(t, 0.0, counter(t, h.metrics, "settle_api_rate_limit_fallback_total", nil))
	}

	// Another client behind the trusted proxy has its own budget; the
	// Alchemy webhook shares the client's budget.
	other := b.postPayment(deposit("other-client", 7, "1"), "X-Forwarded-For", "203.0.113.9")
	require.Equal(t, http.StatusOK, other.status, "%s", other.raw)
	requireError(t, a.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey), http.StatusTooManyRequests)
}

// With Redis unreachable the API neither refuses everything nor stops
// limiting: it limits in process and counts that it did.
func TestRateLimitFallsBackWhenRedisIsDown(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	h := newHarness(t, harnessOptions{
		redisURL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), // nothing listens there
		change:   func(o *httpapi.Options) { o.RateLimit = mustRateLimit(t, "2/h") },
	})
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("fb-1", 7, "1")).status)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("fb-2", 7, "1")).status)
	r := h.postPayment(deposit("fb-3", 7, "1"))
	requireError(t, r, http.StatusTooManyRequests)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, 3.0, counter(t, h.metrics, "settle_api_rate_limit_fallback_total", nil))

	// Ingest needs only PostgreSQL: the api stays ready, and says where
	// Redis stands in /healthz and settle_redis_up.
	ready := h.do(http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, ready.status, "%s", ready.raw)
	health := h.do(http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, health.status)
	require.Equal(t, "unreachable", health.body["redis"])
	require.Contains(t, string(h.do(http.MethodGet, "/metrics", nil, nil).raw), "settle_redis_up 0")
}

func TestRateLimitOff(t *testing.T) {
	limit, err := httpapi.ParseRateLimit("off")
	require.NoError(t, err)
	require.Empty(t, limit)
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.RateLimit = limit }})
	for range 5 {
		requireError(t, h.do(http.MethodPost, "/webhook/payments", []byte(`{}`), nil), http.StatusUnauthorized)
	}
}

func TestParseRateLimit(t *testing.T) {
	l, err := httpapi.ParseRateLimit(httpapi.RateLimitDefault)
	require.NoError(t, err)
	require.Equal(t, httpapi.RateLimit{{Limit: 30, Period: time.Second}, {Limit: 300, Period: time.Minute}}, l)
	require.Equal(t, "30/s,300/m", l.String())
	l, err = httpapi.ParseRateLimit(" 5/s , 100/h ")
	require.NoError(t, err)
	require.Equal(t, "5/s,100/h", l.String())

	for _, bad := range []string{"", "30", "30/d", "0/s", "-1/s", "+3/s", "x/s", "30/s,40/s", "1/s,2/m,3/h,4/s", "30/s,", "OFF", "1000001/s"} {
		_, err := httpapi.ParseRateLimit(bad)
		require.Error(t, err, bad)
	}
}

func TestTrustedProxiesDecideTheClient(t *testing.T) {
	request := func(remote string, forwarded ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		for _, f := range forwarded {
			r.Header.Add("X-Forwarded-For", f)
		}
		return r
	}
	none, err := httpapi.ParseTrustedProxies("")
	require.NoError(t, err)
	lb, err := httpapi.ParseTrustedProxies("10.0.0.0/8, 192.168.1.1, ::1")
	require.NoError(t, err)

	cases := []struct {
		name    string
		proxies httpapi.TrustedProxies
		request *http.Request
		want    string
	}{
		{"default: the socket peer, header ignored", none, request("203.0.113.5:4000", "1.2.3.4"), "203.0.113.5"},
		{"untrusted peer cannot spoof", lb, request("203.0.113.5:4000", "1.2.3.4"), "203.0.113.5"},
		{"trusted peer: rightmost untrusted hop", lb, request("10.1.2.3:4000", "6.6.6.6, 198.51.100.7"), "198.51.100.7"},
		{"trusted hops are skipped", lb, request("10.1.2.3:4000", "198.51.100.7, 10.9.9.9", "192.168.1.1"), "198.51.100.7"},
		{"all hops trusted: the leftmost", lb, request("10.1.2.3:4000", "10.0.0.2"), "10.0.0.2"},
		{"no header: the peer", lb, request("10.1.2.3:4000"), "10.1.2.3"},
		{"garbage ends the walk", lb, request("10.1.2.3:4000", "198.51.100.7, bogus"), "10.1.2.3"},
		{"hop with a port", lb, request("10.1.2.3:4000", "198.51.100.7:5555"), "198.51.100.7"},
		{"ipv6 peer", lb, request("[::1]:4000", "2001:db8::1"), "2001:db8::1"},
		{"ipv4-mapped peer", lb, request("[::ffff:10.1.2.3]:4000", "198.51.100.7"), "198.51.100.7"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, tc.proxies.ClientIP(tc.request).String(), tc.name)
	}

	for _, bad := range []string{"10.0.0.0/33", "not-an-ip", "10.0.0.0/8,,x"} {
		_, err := httpapi.ParseTrustedProxies(bad)
		require.Error(t, err, bad)
	}
}
