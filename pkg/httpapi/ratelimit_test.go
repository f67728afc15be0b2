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

func trustLoopback(t *testing.T, unverified, verified string) func(o *httpapi.Options) {
	return func(o *httpapi.Options) {
		o.RateLimit = mustRateLimit(t, unverified)
		o.VerifiedRateLimit = mustRateLimit(t, verified)
		proxies, err := httpapi.ParseTrustedProxies("127.0.0.1/32")
		require.NoError(t, err)
		o.TrustedProxies = proxies
	}
}

// postUnsigned sends a payments webhook with a wrong signature.
func (h *harness) postUnsigned(body []byte, headers ...string) response {
	h.t.Helper()
	hdr := map[string]string{"Content-Type": "application/json", httpapi.HeaderSignature: sign([]byte("something else"))}
	for i := 0; i+1 < len(headers); i += 2 {
		hdr[headers[i]] = headers[i+1]
	}
	return h.do(http.MethodPost, "/webhook/payments", body, hdr)
}

// WEBHOOK_RATE_LIMIT counts only requests whose signature fails or is
// missing, shared across api instances: once a client has spent it, both
// instances refuse it 429 with Retry-After (before reading its body when
// it carries no signature). Verified deliveries never spend it and are
// not refused by it, from that client too; another client is not
// affected.
func TestUnverifiedRateLimitSharedAcrossInstances(t *testing.T) {
	a := newHarness(t, harnessOptions{change: trustLoopback(t, "3/h", "off")})
	b := newHarness(t, harnessOptions{dsn: a.dsn, redisURL: a.redisURL, change: trustLoopback(t, "3/h", "off")})
	a.createUser(7)

	for i := range 10 {
		r := []*harness{a, b}[i%2].postPayment(deposit(fmt.Sprintf("signed-%d", i), 7, "1"))
		require.Equal(t, http.StatusOK, r.status, "verified deliveries are not limited by WEBHOOK_RATE_LIMIT: %s", r.raw)
	}
	for i, h := range []*harness{a, b, a} {
		requireCode(t, h.postUnsigned(deposit(fmt.Sprintf("forged-%d", i), 7, "1")), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	}
	missing := b.do(http.MethodPost, "/webhook/payments", deposit("unsigned", 7, "1"), nil)
	for _, refused := range []response{missing, a.postUnsigned(deposit("over-forged", 7, "1")), b.postUnsigned(deposit("over-forged-b", 7, "1"))} {
		requireCode(t, refused, http.StatusTooManyRequests, httpapi.CodeRateLimited)
		// The hour window ends at 04:00:00; the clock is pinned at 03:04:05.
		require.Equal(t, "3355", refused.header.Get("Retry-After"))
	}
	require.Equal(t, 10, a.countEvents(), "refused requests stored nothing")
	for i, h := range []*harness{a, b} {
		r := h.postPayment(deposit(fmt.Sprintf("over-signed-%d", i), 7, "1"))
		require.Equal(t, http.StatusOK, r.status, "a verified delivery from a client over WEBHOOK_RATE_LIMIT: %s", r.raw)
	}
	require.Equal(t, 12, a.countEvents())
	require.Equal(t, 0.0, counter(t, a.metrics, "settle_api_rate_limit_fallback_total", nil))

	// Another client behind the trusted proxy has its own budget; the
	// Alchemy webhook shares the client's budget: a forged delivery is
	// refused, a signed one goes through.
	other := b.postUnsigned(deposit("other-client", 7, "1"), "X-Forwarded-For", "203.0.113.9")
	requireCode(t, other, http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	requireCode(t, a.postAlchemy(tokenPayload(t, "0x1", false), "whsec_not-the-key"), http.StatusTooManyRequests, httpapi.CodeRateLimited)
	require.Equal(t, http.StatusOK, a.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey).status)
}

// An IPv6 client is its /64: fresh addresses of one /64 share one budget,
// another /64 has its own.
func TestUnverifiedRateLimitKeysIPv6By64(t *testing.T) {
	h := newHarness(t, harnessOptions{change: trustLoopback(t, "2/h", "off")})
	h.createUser(7)
	for i := range 2 {
		from := fmt.Sprintf("2001:db8:1:2:%x::%x", i+1, i+7)
		requireCode(t, h.postUnsigned(deposit(fmt.Sprintf("v6-%d", i), 7, "1"), "X-Forwarded-For", from), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	}
	requireCode(t, h.postUnsigned(deposit("v6-new", 7, "1"), "X-Forwarded-For", "2001:db8:1:2:ffff:1:2:3"), http.StatusTooManyRequests, httpapi.CodeRateLimited)
	requireCode(t, h.postUnsigned(deposit("v6-other", 7, "1"), "X-Forwarded-For", "2001:db8:1:3::1"), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	requireCode(t, h.postUnsigned(deposit("v4-mapped", 7, "1"), "X-Forwarded-For", "::ffff:198.51.100.1"), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
}

// WEBHOOK_VERIFIED_RATE_LIMIT limits verified deliveries per client, and
// spending it does not touch the unverified budget.
func TestVerifiedRateLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{change: trustLoopback(t, "1/h", "2/h")})
	h.createUser(7)
	for i := range 2 {
		require.Equal(t, http.StatusOK, h.postPayment(deposit(fmt.Sprintf("ok-%d", i), 7, "1")).status)
	}
	r := h.postPayment(deposit("third", 7, "1"))
	requireCode(t, r, http.StatusTooManyRequests, httpapi.CodeRateLimited)
	require.Equal(t, "3355", r.header.Get("Retry-After"))
	require.Equal(t, 2, h.countEvents())
	requireCode(t, h.postUnsigned(deposit("forged", 7, "1")), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("elsewhere", 7, "1"), "X-Forwarded-For", "203.0.113.9").status)
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
	require.Equal(t, http.StatusOK, h.postPayment(deposit("fb-ok", 7, "1")).status)
	requireError(t, h.postUnsigned(deposit("fb-1", 7, "1")), http.StatusUnauthorized)
	requireError(t, h.postUnsigned(deposit("fb-2", 7, "1")), http.StatusUnauthorized)
	r := h.postUnsigned(deposit("fb-3", 7, "1"))
	requireError(t, r, http.StatusTooManyRequests)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Greater(t, counter(t, h.metrics, "settle_api_rate_limit_fallback_total", nil), 3.0)

	// Ingest went on; readiness, as the contract defines it, says Redis
	// is down, and so do /healthz and settle_redis_up.
	ready := h.do(http.MethodGet, "/readyz", nil, nil)
	requireCode(t, ready, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	require.Equal(t, map[string]any{"postgres": "ok", "migrations": "current", "redis": "unreachable"}, ready.body["checks"], "%s", ready.raw)
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

// READY_WITHOUT_REDIS leaves Redis out of /readyz: ingest needs only
// PostgreSQL, so a Redis outage takes no api out of its Service.
func TestReadyWithoutRedis(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	h := newHarness(t, harnessOptions{
		redisURL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), // nothing listens there
		change:   func(o *httpapi.Options) { o.ReadyWithoutRedis = true },
	})
	ready := h.do(http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, ready.status, "%s", ready.raw)
	require.Equal(t, map[string]any{"postgres": "ok", "migrations": "current"}, ready.body["checks"], "%s", ready.raw)
	require.Equal(t, "unreachable", h.do(http.MethodGet, "/healthz", nil, nil).body["redis"])
}
