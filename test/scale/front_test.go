package scale

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Bounds of the front's redelivery of a 503.
const (
	frontAttemptsMax = 5
	frontRetryPause  = 300 * time.Millisecond
	// frontBodyMax is above the api's own 64 KiB limit, so an oversized
	// body still reaches the api and draws its 413.
	frontBodyMax = 1 << 20
)

// front stands where a load balancer and a webhook provider stand in
// production, in front of one or more apis.
//
// Routing: the first delivery of an event goes to the next api in turn;
// every later delivery of the same event id (a duplicate, a concurrent
// duplicate, a conflicting redelivery) goes to a different api than the
// delivery before it. Requests without an event id alternate.
//
// Redelivery: a 503 is the api's documented answer to storage that is
// slow or away ("retry later"), and a provider retries it; so does the
// front, a bounded number of times, each retry to a different api. On a
// loaded machine a storage call can pass the api's 5 s bound; the books
// must still come out right, which is what the tests check.
type front struct {
	URL      string
	backends []string
	client   *http.Client

	delivered []atomic.Int64 // webhook deliveries per api
	crossed   atomic.Int64   // redeliveries sent to another api
	retried   atomic.Int64   // 503 answers redelivered

	mu   sync.Mutex
	next int
	last map[string]int // event id → api of its latest delivery
}

func newFront(t *testing.T, backends ...string) *front {
	t.Helper()
	require.NotEmpty(t, backends)
	transport := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	f := &front{
		backends:  backends,
		client:    &http.Client{Timeout: 30 * time.Second, Transport: transport},
		delivered: make([]atomic.Int64, len(backends)),
		last:      map[string]int{},
	}
	server := httptest.NewServer(f)
	t.Cleanup(func() {
		server.Close()
		transport.CloseIdleConnections()
	})
	f.URL = server.URL
	return f
}

// route picks the api for one delivery of eventID ("" for requests that
// carry none) and remembers it.
func (f *front) route(eventID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.next
	if previous, seen := f.last[eventID]; eventID != "" && seen {
		target = (previous + 1) % len(f.backends)
		f.crossed.Add(1)
	} else {
		f.next = (f.next + 1) % len(f.backends)
	}
	if eventID != "" {
		f.last[eventID] = target
	}
	return target
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, frontBodyMax))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	var event struct {
		EventID string `json:"event_id"`
	}
	_ = json.Unmarshal(body, &event)
	webhook := r.URL.Path == "/webhook/payments"
	for attempt := 1; ; attempt++ {
		target := f.route(event.EventID)
		if webhook {
			f.delivered[target].Add(1)
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, f.backends[target]+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := f.client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if resp.StatusCode == http.StatusServiceUnavailable && attempt < frontAttemptsMax {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, frontBodyMax))
			resp.Body.Close()
			f.retried.Add(1)
			time.Sleep(frontRetryPause)
			continue
		}
		for name, values := range resp.Header {
			w.Header()[name] = values
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, frontBodyMax))
		resp.Body.Close()
		return
	}
}
