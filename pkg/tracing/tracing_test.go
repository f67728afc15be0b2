package tracing

import (
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const validParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"w3c example", validParent, true},
		{"not sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"future version with more fields", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever", true},
		{"empty", "", false},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"uppercase", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", false},
		{"short trace id", "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01", false},
		{"version 00 with trailing data", validParent + "-00", false},
		{"garbage", "hello", false},
		{"too long", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + strings.Repeat("a", 600), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, ok := Parse(tc.in)
			require.Equal(t, tc.ok, ok)
			if ok {
				require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.TraceID().String())
				require.Equal(t, "00f067aa0ba902b7", sc.SpanID().String())
				require.True(t, sc.IsRemote())
			}
		})
	}
	require.Equal(t, validParent, Format(mustParse(t, validParent)))
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", TraceID(validParent))
	require.Empty(t, TraceID("nonsense"))
	require.Empty(t, Format(trace.SpanContext{}))
}

func mustParse(t *testing.T, s string) trace.SpanContext {
	sc, ok := Parse(s)
	require.True(t, ok, s)
	return sc
}

func TestParseTraceID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"00000000000000000000000000000000", ""},
		{"4bf92f3577b34da6a3ce929d0e0e473", ""},
		{"4bf92f35-77b3-4da6-a3ce929d-0e0e4736", ""},
		{"4bf92f3577b34da6a3ce929d0e0e473g", ""},
		{"order-42", ""},
		{"", ""},
	} {
		id, ok := ParseTraceID(tc.in)
		require.Equal(t, tc.want != "", ok, tc.in)
		if ok {
			require.Equal(t, tc.want, id.String(), tc.in)
		}
	}
	for range 100 {
		id := NewTraceID()
		require.Regexp(t, `^[0-9a-f]{32}$`, id)
		_, ok := ParseTraceID(id)
		require.True(t, ok)

		request := NewRequestID()
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, request, "a version 4 UUID")
		traceID, ok := ParseTraceID(request)
		require.True(t, ok)
		require.Equal(t, strings.ReplaceAll(request, "-", ""), traceID.String())
	}
}

// With tracing on, a root span takes the trace id settle chose, and a
// span under a traceparent joins the caller's trace.
func TestTraceIDs(t *testing.T) {
	recorder := tracetest.NewSpanRecorder()
	restore := Use(NewProvider(tracetestProcessor(recorder)))
	defer restore()

	id := NewTraceID()
	ctx, span := Start(WithTraceID(context.Background(), id), "root", Server)
	require.Equal(t, id, span.SpanContext().TraceID().String())
	_, child := Start(ctx, "child", Internal)
	require.Equal(t, id, child.SpanContext().TraceID().String())
	child.End()
	span.End()
	require.Equal(t, span.SpanContext().SpanID(), recorder.Ended()[0].Parent().SpanID())

	_, orphan := StartChild(context.Background(), "rpc", Client)
	require.False(t, orphan.IsRecording(), "no trace, no child span")
	_, rpc := StartChild(ctx, "rpc", Client)
	require.True(t, rpc.IsRecording())
	rpc.End()
	recorder.Reset()

	ctx, traceID := Continue(context.Background(), validParent)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", traceID)
	_, joined := Start(WithTraceID(ctx, id), "joined", Server)
	require.Equal(t, traceID, joined.SpanContext().TraceID().String(), "a parent wins over a requested root id")
	joined.End()
	require.Equal(t, "00f067aa0ba902b7", recorder.Ended()[0].Parent().SpanID().String())

	ctx, traceID = Continue(context.Background(), "00-zz")
	require.Empty(t, traceID)
	_, fresh := Start(ctx, "fresh", Server)
	require.True(t, fresh.SpanContext().IsValid())
	require.NotEqual(t, id, fresh.SpanContext().TraceID().String())

	ctx = ForEvent(context.Background(), Format(joined.SpanContext()), id)
	_, worker := Start(ctx, "worker", Consumer)
	require.Equal(t, traceID4bf(), worker.SpanContext().TraceID().String())
	ctx = ForEvent(context.Background(), "", id)
	_, notify := Start(ctx, "notify", Internal)
	require.Equal(t, id, notify.SpanContext().TraceID().String())
	require.Equal(t, Format(notify.SpanContext()), Traceparent(trace.ContextWithSpan(context.Background(), notify)))
}

func tracetestProcessor(r *tracetest.SpanRecorder) sdktrace.TracerProviderOption {
	return sdktrace.WithSpanProcessor(r)
}

func traceID4bf() string { return "4bf92f3577b34da6a3ce929d0e0e4736" }

// Off, the per-event calls allocate nothing: the performance issue
// measures CPU per event at a trickle.
func TestOffAllocatesNothing(t *testing.T) {
	require.False(t, Enabled())
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c := ForEvent(ctx, validParent, "4bf92f3577b34da6a3ce929d0e0e4736")
		c = WithTraceID(c, "4bf92f3577b34da6a3ce929d0e0e4736")
		c, span := Start(c, "x", Consumer)
		if span.IsRecording() {
			t.Fatal("recording while off")
		}
		End(span, nil)
		if Traceparent(c) != "" {
			t.Fatal("a traceparent from nowhere")
		}
	})
	require.Zero(t, allocs)
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{validParent, "", "00-", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, ok := Parse(s)
		if !ok {
			require.Empty(t, TraceID(s))
			return
		}
		// What settle stores parses back to the same context.
		stored := Format(sc)
		require.Len(t, stored, traceparentLength)
		again, ok := Parse(stored)
		require.True(t, ok, stored)
		require.Equal(t, sc.TraceID(), again.TraceID())
		require.Equal(t, sc.SpanID(), again.SpanID())
		require.Equal(t, sc.IsSampled(), again.IsSampled())
		require.Equal(t, stored, Format(again))
	})
}

func FuzzParseTraceID(f *testing.F) {
	for _, s := range []string{"4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok := ParseTraceID(s)
		if !ok {
			return
		}
		require.True(t, id.IsValid())
		require.Equal(t, strings.ToLower(strings.ReplaceAll(s, "-", "")), id.String())
	})
}

// BenchmarkEventOff is what tracing adds to one event's step while off;
// BenchmarkEventOn the same with a recording provider, for comparison.
//
//	go test -run '^$' -bench BenchmarkEvent -benchmem ./pkg/tracing
func BenchmarkEventOff(b *testing.B) {
	benchmarkEvent(b)
}

func BenchmarkEventOn(b *testing.B) {
	defer Use(NewProvider())()
	benchmarkEvent(b)
}

func benchmarkEvent(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, span := Start(ForEvent(ctx, validParent, "4bf92f3577b34da6a3ce929d0e0e4736"), "payment.process", Consumer)
		_ = Traceparent(c)
		End(span, nil)
	}
}

func BenchmarkNewTraceID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = NewTraceID()
	}
}

// Setup is off without an endpoint or with OTEL_SDK_DISABLED, refuses an
// endpoint the exporter would silently replace with localhost, and with
// a good one turns tracing on until shutdown.
func TestSetup(t *testing.T) {
	ctx := context.Background()
	log := zerolog.Nop()
	for _, tc := range []struct {
		name     string
		env      map[string]string
		on, fail bool
	}{
		{"unset", nil, false, false},
		{"endpoint", map[string]string{EnvEndpoint: "http://127.0.0.1:4318"}, true, false},
		{"traces endpoint", map[string]string{EnvTracesEndpoint: "https://collector.example/v1/traces"}, true, false},
		{"disabled", map[string]string{EnvEndpoint: "http://127.0.0.1:4318", EnvDisabled: "true"}, false, false},
		{"no scheme", map[string]string{EnvEndpoint: "collector:4318"}, false, true},
		{"grpc port, wrong scheme", map[string]string{EnvEndpoint: "grpc://collector:4317"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{EnvEndpoint, EnvTracesEndpoint, EnvDisabled} {
				t.Setenv(name, tc.env[name])
			}
			shutdown, err := Setup(ctx, "test", log)
			if tc.fail {
				require.Error(t, err)
				require.False(t, Enabled())
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.on, Enabled())
			require.NoError(t, shutdown(ctx))
			require.False(t, Enabled(), "shutdown turns tracing off")
		})
	}
}
