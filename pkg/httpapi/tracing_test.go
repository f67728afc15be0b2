package httpapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/tracing"
)

const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
	callerTP    = "00-" + callerTrace + "-" + callerSpan + "-01"
)

// storedTrace is an event's trace_id and traceparent ("" for NULL).
func storedTrace(t *testing.T, dsn, id string) (traceID, traceparent string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT trace_id, COALESCE(traceparent, '') FROM payment_events WHERE event_id = $1`, id).Scan(&traceID, &traceparent))
	return traceID, traceparent
}

// webhookSpans is the recorded spans of /webhook/payments requests.
func webhookSpans(recorder *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		if s.Name() == "POST /webhook/payments" {
			out = append(out, s)
		}
	}
	return out
}

// With tracing on: a valid traceparent continues the caller's trace and
// its trace-id is settle's trace_id; a malformed one is ignored (a new
// trace, the request still accepted); the row keeps the ingest span.
func TestTraceparentOnWebhooks(t *testing.T) {
	recorder := tracetest.NewSpanRecorder()
	defer tracing.Use(tracing.NewProvider(sdktrace.WithSpanProcessor(recorder)))()
	h := newHarness(t, harnessOptions{})
	h.createUser(7)

	r := h.postPayment(deposit("tp-valid", 7, "1"), tracing.HeaderTraceparent, callerTP)
	require.Equal(t, 200, r.status, string(r.raw))
	require.Equal(t, callerTrace, r.body["trace_id"])
	require.Equal(t, callerTrace, r.header.Get(httpapi.HeaderRequestID), "without an X-Request-ID the trace id is echoed")
	traceID, traceparent := storedTrace(t, h.dsn, "tp-valid")
	require.Equal(t, callerTrace, traceID)
	require.Equal(t, callerTrace, tracing.TraceID(traceparent))
	spans := webhookSpans(recorder)
	require.Len(t, spans, 1)
	require.Equal(t, callerSpan, spans[0].Parent().SpanID().String())
	require.Equal(t, callerTrace, spans[0].SpanContext().TraceID().String())

	for i, malformed := range []string{
		"garbage",
		"ff-" + callerTrace + "-" + callerSpan + "-01",              // version ff is invalid
		"00-00000000000000000000000000000000-" + callerSpan + "-01", // zero trace id
		"00-" + callerTrace + "-0000000000000000-01",                // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + callerSpan + "-01", // uppercase
		"00-" + callerTrace + "-" + callerSpan + "-01-extra",        // version 00 has four fields
		"00-" + callerTrace + "-" + callerSpan,                      // no flags
	} {
		id := "tp-bad-" + string(rune('a'+i))
		recorder.Reset()
		r := h.postPayment(deposit(id, 7, "1"), tracing.HeaderTraceparent, malformed)
		require.Equal(t, 200, r.status, "%q: %s", malformed, r.raw)
		fresh, _ := r.body["trace_id"].(string)
		require.Regexp(t, uuidPattern, fresh, malformed)
		require.Equal(t, fresh, r.header.Get(httpapi.HeaderRequestID))
		digits := strings.ReplaceAll(fresh, "-", "")
		require.NotEqual(t, callerTrace, digits, "%q must not be continued", malformed)
		spans := webhookSpans(recorder)
		require.Len(t, spans, 1)
		require.False(t, spans[0].Parent().IsValid(), "%q: a new trace starts at the request", malformed)
		require.Equal(t, digits, spans[0].SpanContext().TraceID().String(), "the new trace is settle's trace_id, its digits")
		traceID, traceparent := storedTrace(t, h.dsn, id)
		require.Equal(t, fresh, traceID)
		require.Equal(t, digits, tracing.TraceID(traceparent))
	}

	recorder.Reset()
	require.Equal(t, 200, h.do("GET", "/healthz", nil, nil).status)
	require.Empty(t, recorder.Ended(), "a probe is no one's trace")

	// The contract's X-Request-ID is the trace_id, with or without a
	// traceparent; a traceparent still continues the caller's trace.
	r = h.postPayment(deposit("tp-request-id", 7, "1"), httpapi.HeaderRequestID, "order-42")
	require.Equal(t, "order-42", r.body["trace_id"])
	require.Equal(t, "order-42", r.header.Get(httpapi.HeaderRequestID))
	recorder.Reset()
	r = h.postPayment(deposit("tp-both", 7, "1"), httpapi.HeaderRequestID, "order-43", tracing.HeaderTraceparent, callerTP)
	require.Equal(t, "order-43", r.body["trace_id"])
	require.Equal(t, "order-43", r.header.Get(httpapi.HeaderRequestID))
	require.Equal(t, callerTrace, webhookSpans(recorder)[0].SpanContext().TraceID().String(), "the caller's trace goes on")
	uuid := "9b2f4c1e-3a5d-4e6f-8a7b-0c1d2e3f4a5b"
	recorder.Reset()
	r = h.postPayment(deposit("tp-uuid", 7, "1"), httpapi.HeaderRequestID, uuid)
	require.Equal(t, uuid, r.body["trace_id"])
	require.Equal(t, "9b2f4c1e3a5d4e6f8a7b0c1d2e3f4a5b", webhookSpans(recorder)[0].SpanContext().TraceID().String(),
		"a caller's UUID is the trace's id")
}

// With tracing off (no exporter) a caller's traceparent still travels
// with the event, and a new trace id is still a UUID.
func TestTraceparentWhileTracingOff(t *testing.T) {
	require.False(t, tracing.Enabled())
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	r := h.postPayment(deposit("off-valid", 7, "1"), tracing.HeaderTraceparent, callerTP)
	require.Equal(t, 200, r.status, string(r.raw))
	require.Equal(t, callerTrace, r.body["trace_id"])
	traceID, traceparent := storedTrace(t, h.dsn, "off-valid")
	require.Equal(t, callerTrace, traceID)
	require.Equal(t, callerTP, traceparent, "the caller's span is the parent of what follows")

	r = h.postPayment(deposit("off-none", 7, "1"), tracing.HeaderTraceparent, "garbage")
	require.Equal(t, 200, r.status, string(r.raw))
	traceID, traceparent = storedTrace(t, h.dsn, "off-none")
	require.Regexp(t, uuidPattern, traceID)
	require.Equal(t, traceID, r.body["trace_id"])
	require.Empty(t, traceparent, "no span, no traceparent")
}

// uuidPattern is a UUID as the contract has the api make a request id.
const uuidPattern = `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`
