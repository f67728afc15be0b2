// Package tracing is settle's OpenTelemetry wiring: the tracer provider
// and its OTLP exporter (Setup), cheap span starts, and the W3C
// traceparent that carries an event's trace through the outbox row and
// its asynq task. Exporters and the SDK live here only; the packages
// that make spans use the otel API through Start.
//
// Tracing is off unless OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set. Off, Start returns its
// context unchanged and a span that does nothing, without allocating,
// while traceparents still travel with the events.
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/settle/settle/pkg/buildinfo"
	"github.com/settle/settle/pkg/logging"
)

// The settings that switch the exporter on (the OTLP exporter reads the
// other OTEL_EXPORTER_OTLP_* settings itself; the SDK reads
// OTEL_TRACES_SAMPLER and OTEL_BSP_*).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// EnvDisabled "true" keeps tracing off whatever the endpoint says,
	// as the OpenTelemetry specification defines it.
	EnvDisabled = "OTEL_SDK_DISABLED"
	// EnvHeaders and EnvTracesHeaders carry the collector's credentials
	// (name=value pairs, comma-separated, values percent-encoded).
	EnvHeaders       = "OTEL_EXPORTER_OTLP_HEADERS"
	EnvTracesHeaders = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
)

// instrumentationName names settle's tracer.
const instrumentationName = "github.com/settle/settle"

// exportErrorLogEvery bounds the log lines of a collector that keeps
// failing: one per interval, with the count of the ones left out.
const exportErrorLogEvery = time.Minute

var (
	enabled atomic.Bool
	tracer  atomic.Pointer[trace.Tracer]
	// disabledSpan is boxed once, so an off Start allocates nothing.
	disabledSpan trace.Span = noop.Span{}
)

// Enabled reports whether spans are recorded and exported.
func Enabled() bool { return enabled.Load() }

// Setup installs the tracer provider of the binary named service: OTLP
// over HTTP when an endpoint is configured, else nothing (tracing off).
// shutdown flushes the spans still buffered; call it on the way out.
func Setup(ctx context.Context, service string, log zerolog.Logger) (shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if strings.EqualFold(os.Getenv(EnvDisabled), "true") {
		return off, nil
	}
	configured := false
	var endpoints []string
	for _, name := range []string{EnvEndpoint, EnvTracesEndpoint} {
		value := os.Getenv(name)
		if value == "" {
			continue
		}
		endpoints = append(endpoints, value)
		// The exporter would quietly fall back to localhost on a bad one.
		if u, err := url.Parse(value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%s: not an http(s) URL with a host", name)
		}
		configured = true
	}
	if !configured {
		return off, nil
	}
	// The exporter prints a malformed entry, credential and all, to
	// stderr through otel's own logger, and then runs without it.
	for _, name := range []string{EnvHeaders, EnvTracesHeaders} {
		if err := checkHeaders(os.Getenv(name)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	// The exporter's errors name the URL it posts to, whose path or query
	// may hold the collector's ingest key, and quote the collector's answer.
	redact := logging.NewRedactor(endpoints...)
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvEndpoint, redactExportError(redact, err))
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read last, win over
	// the binary's own name, as operators expect of the standard settings.
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(buildinfo.Get().Version)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	otel.SetErrorHandler(errorLogger(log, redact))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	restore := Use(tp)
	return func(ctx context.Context) error {
		defer restore()
		return redactExportError(redact, tp.Shutdown(ctx))
	}, nil
}

// checkHeaders refuses what the exporter's header parser would log and
// drop (its rules, otlptracehttp's internal/envconfig), without quoting
// any of it: the entries are credentials.
func checkHeaders(value string) error {
	if value == "" {
		return nil
	}
	entries := strings.Split(value, ",")
	for i, entry := range entries {
		name, v, found := strings.Cut(entry, "=")
		switch {
		case !found:
			return fmt.Errorf("entry %d of %d is not name=value", i+1, len(entries))
		case !validHeaderName(strings.TrimSpace(name)):
			return fmt.Errorf("entry %d of %d: the name is not an HTTP header name", i+1, len(entries))
		}
		if _, err := url.PathUnescape(v); err != nil {
			return fmt.Errorf("entry %d of %d: the value is not percent-encoded (a literal %% is %%25)", i+1, len(entries))
		}
	}
	return nil
}

// validHeaderName: an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if c > unicode.MaxASCII || !(unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	return true
}

// NewProvider is an SDK provider that honours WithTraceID, for tests that
// record spans (tracetest) with the ids production would give them.
func NewProvider(opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithIDGenerator(idGenerator{})}, opts...)...)
}

// Use makes tp the provider of every span started through this package
// (and otel's global one) and turns tracing on; restore puts back what
// was there. Setup calls it; tests use it with a recording provider.
func Use(tp trace.TracerProvider) (restore func()) {
	previousProvider, previousTracer, previousEnabled := otel.GetTracerProvider(), tracer.Load(), enabled.Load()
	t := tp.Tracer(instrumentationName)
	otel.SetTracerProvider(tp)
	tracer.Store(&t)
	enabled.Store(true)
	return func() {
		otel.SetTracerProvider(previousProvider)
		tracer.Store(previousTracer)
		enabled.Store(previousEnabled)
	}
}

// Kind is the span kind of Start.
type Kind int

// Span kinds, as OpenTelemetry defines them.
const (
	Internal Kind = iota
	Server
	Client
	Producer
	Consumer
)

// kindOptions are built once: a per-call option slice would allocate.
var kindOptions = [...][]trace.SpanStartOption{
	Internal: {trace.WithSpanKind(trace.SpanKindInternal)},
	Server:   {trace.WithSpanKind(trace.SpanKindServer)},
	Client:   {trace.WithSpanKind(trace.SpanKindClient)},
	Producer: {trace.WithSpanKind(trace.SpanKindProducer)},
	Consumer: {trace.WithSpanKind(trace.SpanKindConsumer)},
}

// Start starts a span under the one in ctx (or, without one, a root span
// in the trace WithTraceID asked for). Off, it returns ctx itself and a
// span that does nothing: set attributes only when span.IsRecording(),
// so that building them costs nothing either.
func Start(ctx context.Context, name string, kind Kind) (context.Context, trace.Span) {
	if !enabled.Load() {
		return ctx, disabledSpan
	}
	return (*tracer.Load()).Start(ctx, name, kindOptions[kind]...)
}

// StartChild is Start for a step that means something only inside a
// trace, like one RPC call: without a span in ctx it records nothing, so
// background loops (the chain scanner, the reorg watch) make no traces of
// one span each.
func StartChild(ctx context.Context, name string, kind Kind) (context.Context, trace.Span) {
	if !enabled.Load() || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, disabledSpan
	}
	return (*tracer.Load()).Start(ctx, name, kindOptions[kind]...)
}

// StartAt is Start with the span's start time given: for a step that
// happened before its events were known apart (a claim of many events
// gets one span per event afterwards). Only for recording paths: it
// allocates.
func StartAt(ctx context.Context, name string, kind Kind, at time.Time) (context.Context, trace.Span) {
	if !enabled.Load() {
		return ctx, disabledSpan
	}
	return (*tracer.Load()).Start(ctx, name, trace.WithSpanKind(trace.SpanKind(kind+1)), trace.WithTimestamp(at))
}

// End records err (if any) on span and ends it.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, logging.RedactError(err).Error())
	}
	span.End()
}

// exportErrorMax bounds an export error's text in the log: it quotes the
// collector's answer, whatever its length.
const exportErrorMax = 1024

// redactExportError is err with the configured endpoints shortened to
// scheme and host, their secret parts hidden wherever they appear, and
// its text cut at exportErrorMax.
func redactExportError(redact *logging.Redactor, err error) error {
	if err == nil {
		return nil
	}
	return logging.Redacted(err, logging.Cut(redact.Error(err).Error(), exportErrorMax))
}

// errorLogger sends otel's own errors (an export that failed) to the
// binary's log, the endpoints' secrets hidden, at most one line per
// exportErrorLogEvery.
func errorLogger(log zerolog.Logger, redact *logging.Redactor) otel.ErrorHandler {
	var last atomic.Int64
	var suppressed atomic.Int64
	return otel.ErrorHandlerFunc(func(err error) {
		now := time.Now().UnixNano()
		previous := last.Load()
		if now-previous < int64(exportErrorLogEvery) || !last.CompareAndSwap(previous, now) {
			suppressed.Add(1)
			return
		}
		log.Warn().Err(redactExportError(redact, err)).Int64("suppressed", suppressed.Swap(0)).
			Msg("tracing: spans not exported")
	})
}

// FlushTimeout bounds the export of the spans still buffered at exit.
const FlushTimeout = 5 * time.Second

// Begin is Setup for a binary's main: tracing that cannot be set up is
// logged and left off (it must never keep payments from running), and
// end flushes within FlushTimeout.
func Begin(service string, log zerolog.Logger) (end func()) {
	shutdown, err := Setup(context.Background(), service, log)
	if err != nil {
		log.Error().Err(logging.RedactError(err)).Msg("tracing not set up; running without it")
		return func() {}
	}
	if Enabled() {
		log.Info().Msg("tracing: exporting spans over OTLP/HTTP")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), FlushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn().Err(logging.RedactError(err)).Msg("tracing: spans left unexported at exit")
		}
	}
}
