package test

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/settle/settle/pkg/tracing"
	"github.com/settle/settle/test/harness"
)

// otlpSpan is one span as a collector received it.
type otlpSpan struct {
	service, version        string
	name                    string
	traceID, spanID, parent string
	eventID                 string
}

// otlpReceiver is a minimal OTLP/HTTP collector: POST /v1/traces with an
// ExportTraceServiceRequest in protobuf, as otlptracehttp sends it.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
	bad   []string
}

// otlpBodyMax bounds one export request the receiver reads.
const otlpBodyMax = 16 << 20

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		o.fail(r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type"))
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	raw, err := readExport(r)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &req)
	}
	if err != nil {
		o.fail(err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		var service, version string
		for _, kv := range rs.GetResource().GetAttributes() {
			switch kv.GetKey() {
			case "service.name":
				service = kv.GetValue().GetStringValue()
			case "service.version":
				version = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				span := otlpSpan{service: service, version: version, name: s.GetName(),
					traceID: hex.EncodeToString(s.GetTraceId()), spanID: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId())}
				for _, kv := range s.GetAttributes() {
					if kv.GetKey() == "settle.event_id" {
						span.eventID = kv.GetValue().GetStringValue()
					}
				}
				o.spans = append(o.spans, span)
			}
		}
	}
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	body2, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(body2)
}

// readExport reads an export request's body, gzipped or not, bounded.
func readExport(r *http.Request) ([]byte, error) {
	body := io.LimitReader(r.Body, otlpBodyMax)
	if r.Header.Get("Content-Encoding") != "gzip" {
		return io.ReadAll(body)
	}
	gz, err := gzip.NewReader(body)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(gz, otlpBodyMax))
}

func (o *otlpReceiver) fail(why string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bad = append(o.bad, why)
}

// trace is the received spans of one trace, by name.
func (o *otlpReceiver) trace(traceID string) map[string][]otlpSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]otlpSpan{}
	for _, s := range o.spans {
		if s.traceID == traceID {
			out[s.name] = append(out[s.name], s)
		}
	}
	return out
}

// TestTraceAcrossProcesses: the real api, scheduler and worker binaries,
// each exporting OTLP/HTTP to a collector in the test, put one event's
// spans in one trace, the caller's, each under the previous process's:
// the claim and enqueue are the api's when it hands a trickle's event to
// the queue itself (INGEST_HANDOFF_MAX), the scheduler's when it does not.
func TestTraceAcrossProcesses(t *testing.T) {
	for _, enqueuer := range []string{"api", "scheduler"} {
		t.Run("enqueued by "+enqueuer, func(t *testing.T) { traceAcrossProcesses(t, enqueuer) })
	}
}

func traceAcrossProcesses(t *testing.T, enqueuer string) {
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	defer collector.Close()

	s := harness.NewStack(t)
	s.Env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL
	s.Env["OTEL_BSP_SCHEDULE_DELAY"] = "100" // milliseconds: export soon, not every 5s
	if enqueuer == "scheduler" {
		s.Env["INGEST_HANDOFF_MAX"] = "0"
	}
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)

	const traceID, callerSpan = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
	body := harness.Payment("otlp-1", "deposit", 1, "ETH", "1.5")
	req, err := http.NewRequest(http.MethodPost, api.URL()+"/webhook/payments", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Signature", harness.Sign(body, harness.WebhookSecret))
	req.Header.Set(tracing.HeaderTraceparent, "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := client.HTTP.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s.WaitFor("otlp-1 confirmed", time.Minute, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'otlp-1' AND status = 'confirmed' AND trace_id = $1`, traceID) == 1
	})

	want := map[string]string{
		"POST /webhook/payments": "api", "ingest.insert": "api",
		"outbox.claim": enqueuer, "queue.enqueue": enqueuer,
		"payment.process": "worker", "ledger.commit": "worker",
	}
	s.WaitFor("the event's spans from all three processes", 30*time.Second, func() bool {
		spans := receiver.trace(traceID)
		for name := range want {
			if len(spans[name]) == 0 {
				return false
			}
		}
		return true
	})
	spans := receiver.trace(traceID)
	for name, service := range want {
		for _, sp := range spans[name] {
			require.Equal(t, service, sp.service, name)
			require.NotEmpty(t, sp.version, "%s: service.version from buildinfo", name)
		}
	}
	one := func(name string) otlpSpan {
		require.Len(t, spans[name], 1, name)
		return spans[name][0]
	}
	request, ingest, enqueue, process := one("POST /webhook/payments"), one("ingest.insert"), one("queue.enqueue"), one("payment.process")
	require.Equal(t, callerSpan, request.parent, "the api continues the caller's span")
	require.Equal(t, request.spanID, ingest.parent)
	require.Equal(t, ingest.spanID, one("outbox.claim").parent, "the %s continues the row's span", enqueuer)
	require.Equal(t, ingest.spanID, enqueue.parent)
	require.Equal(t, enqueue.spanID, process.parent, "the worker continues the task's span")
	require.Equal(t, process.spanID, one("ledger.commit").parent)
	require.Equal(t, "otlp-1", process.eventID)
	receiver.mu.Lock()
	defer receiver.mu.Unlock()
	require.Empty(t, receiver.bad, "every export was OTLP/HTTP protobuf")
}
