//go:build !fuzzing

package chain

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/settle/settle/pkg/testenv"
)

// slowNode answers every eth_getBlockByNumber after latency.
func slowNode(tb testing.TB, latency time.Duration) *httptest.Server {
	tb.Helper()
	block := fmt.Sprintf(`{"number":"0x1","hash":"0x%s","timestamp":"0x1"}`, strings.Repeat("ab", 32))
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(latency):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, block)
	}))
	tb.Cleanup(server.Close)
	return server
}

// BenchmarkConcurrentCalls measures whether the shared breaker serialises
// calls. Two workers (separate Redis clients, one shared breaker state)
// make `callers` concurrent calls per op against a node that takes 50ms
// to answer. latencies/op near 1 means the calls overlapped; a breaker
// holding a shared lock around each call would show about `callers`.
func BenchmarkConcurrentCalls(b *testing.B) {
	const latency = 50 * time.Millisecond
	node := slowNode(b, latency)
	for _, store := range []string{"redis", "in_process"} {
		for _, callers := range []int{1, 8, 32, 64} {
			b.Run(fmt.Sprintf("store=%s/callers=%d", store, callers), func(b *testing.B) {
				opts := workerOptions{}
				if store == "redis" {
					opts.redisURL = testenv.RedisURL(b)
				}
				workers := []*worker{newWorker(b, node.URL, opts), newWorker(b, node.URL, opts)}
				ctx := testContext(b)
				for b.Loop() {
					var wg sync.WaitGroup
					for i := range callers {
						w := workers[i%len(workers)]
						wg.Go(func() {
							if err := w.latest(ctx); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(latency), "latencies/op")
			})
		}
	}
}

// BenchmarkBreakerOverhead is the cost the breaker adds to one call: two
// Redis round trips (allow, report) against the in-process breaker's none.
func BenchmarkBreakerOverhead(b *testing.B) {
	node := slowNode(b, 0)
	for _, store := range []string{"redis", "in_process"} {
		b.Run("store="+store, func(b *testing.B) {
			opts := workerOptions{}
			if store == "redis" {
				opts.redisURL = testenv.RedisURL(b)
			}
			w := newWorker(b, node.URL, opts)
			ctx := testContext(b)
			for b.Loop() {
				if err := w.latest(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
