package httpapi_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/settle/settle/pkg/httpapi"
)

// benchConcurrency is the number of deliveries in flight at once.
const benchConcurrency = 16

var benchRun atomic.Int64

// BenchmarkWebhookIngest measures accepted payments webhooks per second,
// and their p50/p99 latency, at a fixed concurrency, over real HTTP into
// real PostgreSQL (fsync on). Every delivery is a new signed event, so
// each one is a committed insert plus its pg_notify.
//
//	go test -run '^$' -bench BenchmarkWebhookIngest -benchtime 5000x ./pkg/httpapi/
func BenchmarkWebhookIngest(b *testing.B) {
	h := newHarness(b, harnessOptions{})
	h.createUser(7)
	run := benchRun.Add(1)
	client := &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency}}

	var next atomic.Int64
	var failures atomic.Int64
	latencies := make([][]time.Duration, benchConcurrency)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for worker := range benchConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				body := deposit(fmt.Sprintf("bench-%d-%d", run, n), 7, "0.000001")
				req, err := http.NewRequest(http.MethodPost, h.url+"/webhook/payments", bytes.NewReader(body))
				if err != nil {
					failures.Add(1)
					continue
				}
				req.Header.Set(httpapi.HeaderSignature, sign(body))
				sent := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					failures.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failures.Add(1)
					continue
				}
				latencies[worker] = append(latencies[worker], time.Since(sent))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failures.Load() > 0 {
		b.Fatalf("%d deliveries were not accepted", failures.Load())
	}
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	percentile := func(p float64) time.Duration { return all[int(p*float64(len(all)-1))] }
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "accepted/s")
	b.ReportMetric(float64(percentile(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}
