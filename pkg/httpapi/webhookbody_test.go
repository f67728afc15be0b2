package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
)

// slowBody is a webhook whose headers promise declared bytes and whose
// body arrives only as far as sent, over a raw connection.
type slowBody struct {
	conn   net.Conn
	reader *bufio.Reader
}

func startSlowBody(t *testing.T, base, path, from string, declared int, sent []byte) *slowBody {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Signature: %s\r\nX-Forwarded-For: %s\r\n\r\n",
		path, u.Host, declared, strings.Repeat("0", 64), from)
	_, err = conn.Write(append([]byte(head), sent...))
	require.NoError(t, err)
	return &slowBody{conn: conn, reader: bufio.NewReader(conn)}
}

// answer reads the response the server sent without waiting for the body.
func (b *slowBody) answer(t *testing.T, within time.Duration) *http.Response {
	t.Helper()
	require.NoError(t, b.conn.SetReadDeadline(time.Now().Add(within)))
	resp, err := http.ReadResponse(b.reader, nil)
	require.NoError(t, err, "the server answers before the body is complete")
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

// stillReading reports that the server has not answered yet.
func (b *slowBody) stillReading(t *testing.T) {
	t.Helper()
	require.NoError(t, b.conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err := b.reader.Peek(1)
	var netErr net.Error
	require.ErrorAs(t, err, &netErr)
	require.True(t, netErr.Timeout(), "the server answered a body still arriving: %v", err)
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func waitGauge(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for gauge(t, reg, name) != want {
		require.True(t, time.Now().Before(deadline), "%s is %v, want %v", name, gauge(t, reg, name), want)
		time.Sleep(10 * time.Millisecond)
	}
}

// The bytes of unverified bodies in flight are bounded: a body reserves
// its declared length before a byte is read; one client (an IPv6 /64)
// holds at most its share, and a full budget refuses at once with 503 and
// Retry-After instead of queueing. Releasing a reservation lets the next
// webhook in.
func TestUnverifiedBytesAreBounded(t *testing.T) {
	const mib = 1 << 20
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.RateLimit = nil
		o.UnverifiedBytesMax = 2 * mib
		o.UnverifiedClientBytesMax = mib
		proxies, err := httpapi.ParseTrustedProxies("127.0.0.1/32")
		require.NoError(t, err)
		o.TrustedProxies = proxies
	}})
	h.createUser(7)
	const inFlight = "settle_api_unverified_body_bytes"

	first := startSlowBody(t, h.url, "/webhook/alchemy", "2001:db8:5:6::1", mib, []byte(`{"webhookId":`))
	waitGauge(t, h.metrics, inFlight, mib)
	first.stillReading(t)

	// The same /64 from another address: its share is taken.
	sameClient := startSlowBody(t, h.url, "/webhook/alchemy", "2001:db8:5:6:ffff::2", mib, nil)
	resp := sameClient.answer(t, 5*time.Second)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))

	// Another client takes the rest of the budget; then even a small
	// signed webhook does not fit and is refused at once.
	second := startSlowBody(t, h.url, "/webhook/alchemy", "198.51.100.4", mib, nil)
	waitGauge(t, h.metrics, inFlight, 2*mib)
	second.stillReading(t)
	full := h.postPayment(deposit("budget-full", 7, "1"), "X-Forwarded-For", "203.0.113.9")
	requireCode(t, full, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	require.Equal(t, "1", full.header.Get("Retry-After"))
	require.Equal(t, 2.0, counter(t, h.metrics, "settle_api_unverified_budget_refused_total", nil))

	// A body that ends (here: its sender gives up) releases its bytes.
	require.NoError(t, first.conn.Close())
	waitGauge(t, h.metrics, inFlight, mib)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("budget-free", 7, "1"), "X-Forwarded-For", "203.0.113.9").status)
	require.NoError(t, second.conn.Close())
	waitGauge(t, h.metrics, inFlight, 0)
	require.Equal(t, 1, h.countEvents())
}

// A client over its unverified limit is refused before its body is read
// when the request carries none of the route's signature headers (here
// X-Signature on the Alchemy route), and a declared length over the
// route's limit is refused before a byte of it is read; both count
// against the unverified limit. One carrying a wrong signature is read,
// then refused 429 all the same.
func TestRefusedBeforeTheBodyIsRead(t *testing.T) {
	h := newHarness(t, harnessOptions{change: trustLoopback(t, "2/h", "off")})
	h.createUser(7)
	tooLarge := startSlowBody(t, h.url, "/webhook/payments", "198.51.100.8", httpapi.PaymentsBodyMax+1, nil)
	tooLargeAnswer := tooLarge.answer(t, 5*time.Second)
	_ = tooLargeAnswer.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, tooLargeAnswer.StatusCode)
	requireCode(t, h.postUnsigned(deposit("forged", 7, "1"), "X-Forwarded-For", "198.51.100.8"), http.StatusUnauthorized, httpapi.CodeInvalidSignature)

	over := startSlowBody(t, h.url, "/webhook/alchemy", "198.51.100.8", httpapi.ProviderBodyMaxDefault, []byte(`{`))
	resp := over.answer(t, 5*time.Second)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "3355", resp.Header.Get("Retry-After"))
	forged := h.postUnsigned(deposit("forged-over", 7, "1"), "X-Forwarded-For", "198.51.100.8")
	requireCode(t, forged, http.StatusTooManyRequests, httpapi.CodeRateLimited)
	require.Equal(t, 0, h.countEvents())
}

// A body sent without a declared length (chunked) is cut at the route's
// limit: 413, nothing stored.
func TestChunkedBodyOverTheLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	over := bytes.Repeat([]byte(" "), httpapi.PaymentsBodyMax+1)
	req, err := http.NewRequest(http.MethodPost, h.url+"/webhook/payments", io.MultiReader(bytes.NewReader(over)))
	require.NoError(t, err)
	req.Header.Set(httpapi.HeaderSignature, sign(over))
	requireCode(t, h.send(req), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
	exact := append(deposit("chunked", 7, "1"), bytes.Repeat([]byte(" "), 100)...)
	req, err = http.NewRequest(http.MethodPost, h.url+"/webhook/payments", io.MultiReader(bytes.NewReader(exact)))
	require.NoError(t, err)
	req.Header.Set(httpapi.HeaderSignature, sign(exact))
	require.Equal(t, http.StatusOK, h.send(req).status)
	require.Equal(t, 1, h.countEvents())
}
