package tracing

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderTraceparent is the W3C Trace Context header.
const HeaderTraceparent = "traceparent"

// traceparentLength is a version-00 traceparent: 00-<32 hex>-<16 hex>-<2 hex>.
const traceparentLength = 55

// traceContext parses and checks traceparents as the W3C spec says
// (versions, all-zero ids, flags), so settle has no parser of its own.
var traceContext propagation.TraceContext

// oneHeader is a carrier holding only a traceparent; tracestate is not
// carried (the outbox row keeps the traceparent alone).
type oneHeader string

func (h oneHeader) Get(key string) string {
	if key == HeaderTraceparent {
		return string(h)
	}
	return ""
}
func (oneHeader) Set(string, string) {}
func (oneHeader) Keys() []string     { return []string{HeaderTraceparent} }

// Parse reads a traceparent; ok is false for anything the W3C spec would
// not continue (the caller then starts a new trace).
func Parse(traceparent string) (sc trace.SpanContext, ok bool) {
	if traceparent == "" || len(traceparent) > traceparentLengthMax {
		return trace.SpanContext{}, false
	}
	sc = trace.SpanContextFromContext(traceContext.Extract(context.Background(), oneHeader(traceparent)))
	return sc, sc.IsValid()
}

// traceparentLengthMax bounds what Parse looks at: a future version may
// append fields, but nothing settle stores needs more.
const traceparentLengthMax = 512

// Format is sc as a version-00 traceparent ("" for an invalid one).
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [traceparentLength]byte
	traceID, spanID := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], traceID[:])
	b[35] = '-'
	hex.Encode(b[36:52], spanID[:])
	b[52], b[53], b[54] = '-', '0', '0'
	if sc.IsSampled() {
		b[54] = '1'
	}
	return string(b[:])
}

// Traceparent is the traceparent of the span in ctx, local or remote, for
// the outbox row or the task ("" without one).
func Traceparent(ctx context.Context) string {
	return Format(trace.SpanContextFromContext(ctx))
}

// TraceID is the trace id of a traceparent ("" when it is not one), e.g.
// for a link to a tracing UI.
func TraceID(traceparent string) string {
	sc, ok := Parse(traceparent)
	if !ok {
		return ""
	}
	return sc.TraceID().String()
}

// Continue returns ctx continuing the caller's trace named by
// traceparent, with that trace's id; a traceparent that does not parse
// is ignored (ctx unchanged, id ""), so a new trace starts.
func Continue(ctx context.Context, traceparent string) (_ context.Context, traceID string) {
	sc, ok := Parse(traceparent)
	if !ok {
		return ctx, ""
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), sc.TraceID().String()
}

// rootTraceIDKey holds the trace id the next root span started from the
// context takes (idGenerator).
type rootTraceIDKey struct{}

// WithTraceID asks that a root span started from ctx belong to the trace
// settle already knows the event by: id is settle's trace_id, 32 hex
// digits (or a UUID, dashes ignored). Any other id, or tracing off,
// leaves ctx as it is and such a span starts a trace of its own.
func WithTraceID(ctx context.Context, id string) context.Context {
	if !enabled.Load() {
		return ctx
	}
	traceID, ok := ParseTraceID(id)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, rootTraceIDKey{}, traceID)
}

// ForEvent is the context an event's work is traced in: under the span
// its traceparent names, else a root span in the trace of its trace_id.
// Off, it is ctx: nothing downstream would read it.
func ForEvent(ctx context.Context, traceparent, traceID string) context.Context {
	if !enabled.Load() {
		return ctx
	}
	if traceparent != "" {
		if sc, ok := Parse(traceparent); ok {
			return trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	return WithTraceID(ctx, traceID)
}

// ParseTraceID reads settle's trace_id as an OpenTelemetry trace id: 32
// hex digits, or a UUID with its dashes, not all zero.
func ParseTraceID(id string) (trace.TraceID, bool) {
	var digits [32]byte
	n := 0
	switch len(id) {
	case 32:
		n = copy(digits[:], id)
	case 36:
		for i := 0; i < len(id); i++ {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if id[i] != '-' {
					return trace.TraceID{}, false
				}
				continue
			}
			digits[n] = id[i]
			n++
		}
	default:
		return trace.TraceID{}, false
	}
	var traceID trace.TraceID
	if _, err := hex.Decode(traceID[:], digits[:n]); err != nil || n != 32 || !traceID.IsValid() {
		return trace.TraceID{}, false
	}
	return traceID, true
}

// NewTraceID is a new random trace id for work settle starts itself (a
// scanner pass): 32 lowercase hex digits, a valid W3C trace id.
func NewTraceID() string {
	id := newTraceID()
	var b [32]byte
	hex.Encode(b[:], id[:])
	return string(b[:]) // one allocation
}

// NewRequestID is the id the api gives a request that brings none: a
// random (version 4) UUID, as the contract says, whose 32 hex digits are
// a valid W3C trace id, so its trace is found under the same digits
// (ParseTraceID).
func NewRequestID() string {
	id := newTraceID()
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // the RFC 9562 variant
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	hex.Encode(b[9:13], id[4:6])
	hex.Encode(b[14:18], id[6:8])
	hex.Encode(b[19:23], id[8:10])
	hex.Encode(b[24:36], id[10:16])
	b[8], b[13], b[18], b[23] = '-', '-', '-', '-'
	return string(b[:])
}

// Ids come from crypto/rand, as the UUIDs settle made before: a trace id
// is in every log line and answer, so it must not be guessable.
func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		_, _ = rand.Read(id[:]) // never fails (Go 1.24+: it crashes instead)
	}
	return id
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		_, _ = rand.Read(id[:])
	}
	return id
}

// idGenerator is the SDK's random ids, except that a root span takes the
// trace id WithTraceID put in its context: the trace id in settle's logs
// and rows and the one in the tracing UI are then the same.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if id, ok := ctx.Value(rootTraceIDKey{}).(trace.TraceID); ok {
		return id, newSpanID()
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }
