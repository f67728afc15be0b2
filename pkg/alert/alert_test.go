package alert

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestKeyTableStaysBounded(t *testing.T) {
	a := New(zerolog.New(io.Discard), Options{KeysMax: 1000})
	defer a.Close()
	for i := range 10_000 {
		a.Raise(fmt.Sprintf("key-%d", i), Warning, "x", nil)
	}
	require.Equal(t, 1000, a.TrackedKeys(), "the table never grows past its bound")

	// Once the first keys' cooldown passed, they are evicted for new ones.
	now := time.Now().Add(CooldownDefault + time.Second)
	a.now = func() time.Time { return now }
	a.Raise("fresh", Warning, "x", nil)
	require.LessOrEqual(t, a.TrackedKeys(), 1000)
	a.mu.Lock()
	_, tracked := a.keys["fresh"]
	a.mu.Unlock()
	require.True(t, tracked, "stale keys were evicted to make room")
}

func TestRepeatedKeyIsSuppressedInsideItsCooldown(t *testing.T) {
	var posts atomic.Int64
	var mu sync.Mutex
	var last Alert
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg Alert
		_ = json.NewDecoder(r.Body).Decode(&msg)
		mu.Lock()
		last = msg
		mu.Unlock()
		posts.Add(1)
	}))
	defer srv.Close()
	a := New(zerolog.New(io.Discard), Options{WebhookURL: srv.URL, Service: "test"})
	defer a.Close()
	start := time.Now()
	clock := start
	a.now = func() time.Time { return clock }

	for range 5 {
		a.Raise("same", Critical, "boom", map[string]any{"n": 1})
	}
	clock = start.Add(CooldownDefault + time.Second)
	a.Raise("same", Critical, "boom again", nil)
	require.Eventually(t, func() bool { return posts.Load() == 2 }, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "boom again", last.Summary)
	require.Equal(t, 4, last.Suppressed, "the four suppressed repeats are reported with the next alert")
	require.Equal(t, "test", last.Service)
}

func TestRaiseNeverBlocksWhenTheWebhookHangs(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	a := New(zerolog.New(io.Discard), Options{WebhookURL: srv.URL, QueueMax: 4})
	defer a.Close()
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			a.Raise(fmt.Sprintf("k%d", i), Warning, "x", nil)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Raise blocked on a hanging webhook")
	}
}

func TestDeliveryRetriesThenGivesUp(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer srv.Close()
	a := New(zerolog.New(io.Discard), Options{WebhookURL: srv.URL})
	defer a.Close()
	a.Raise("k", Critical, "x", nil)
	require.Eventually(t, func() bool { return calls.Load() == DeliveryAttemptsMax }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(3 * deliveryBackoffFirst)
	require.EqualValues(t, DeliveryAttemptsMax, calls.Load(), "bounded attempts")
}

func TestFailedDeliveryLogsNoURL(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/services/T0/B0/SECRETPATH123"
	srv.Close() // refused
	var logs syncBuffer
	a := New(zerolog.New(&logs), Options{WebhookURL: url, Client: &http.Client{Timeout: time.Second}})
	a.Raise("k", Critical, "x", nil)
	require.Eventually(t, func() bool { return a.deliveryErr != nil && logs.contains("alert webhook delivery failed") }, 10*time.Second, 20*time.Millisecond)
	a.Close()
	require.NotContains(t, logs.String(), "SECRETPATH123")
	require.Contains(t, logs.String(), srv.Listener.Addr().String(), "scheme and host are kept")
}

type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

func (b *syncBuffer) contains(s string) bool { return strings.Contains(b.String(), s) }

// TestRedirectIsAFailedDelivery: an alert receiver answering a redirect
// is not followed (a 307 re-posted the alert, with the configured URL as
// Referer, to another host; a 301 turned it into a body-less GET counted
// delivered); the delivery fails and is counted.
func TestRedirectIsAFailedDelivery(t *testing.T) {
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusMovedPermanently} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var elsewhere atomic.Int32
			other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
			defer other.Close()
			configured := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, other.URL+"/collect", code)
			}))
			defer configured.Close()
			a := New(zerolog.New(io.Discard), Options{WebhookURL: configured.URL + "/hooks/secret", Service: "test"})
			defer a.Close()
			a.Raise("ledger:e1", Critical, "compensation exceeds balance", map[string]any{"event_id": "e1"})
			require.Eventually(t, func() bool { return counterValue(a.deliveryErr) > 0 }, 10*time.Second, 20*time.Millisecond, "a failed delivery")
			require.Zero(t, elsewhere.Load(), "nothing sent where the redirect pointed")
		})
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
