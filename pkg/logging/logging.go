// Package logging sets up zerolog: JSON lines on stderr, one event per
// line, with the trace id of the request or event that caused it.
package logging

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Field names shared by every binary.
const (
	FieldTraceID = "trace_id"
	FieldEventID = "event_id"
	FieldUserID  = "user_id"
)

// levels are the LOG_LEVEL names. zerolog.ParseLevel also takes any
// integer and "disabled", which would silence every line, alerts and
// errors included ("alerts are always logged").
var levels = map[string]zerolog.Level{
	"trace": zerolog.TraceLevel,
	"debug": zerolog.DebugLevel,
	"info":  zerolog.InfoLevel,
	"warn":  zerolog.WarnLevel,
	"error": zerolog.ErrorLevel,
	"fatal": zerolog.FatalLevel,
	"panic": zerolog.PanicLevel,
}

// ParseLevel accepts zerolog's level names, in any case.
func ParseLevel(s string) (zerolog.Level, error) {
	level, ok := levels[strings.ToLower(strings.TrimSpace(s))]
	if !ok {
		return zerolog.InfoLevel, fmt.Errorf("%q is not one of trace, debug, info, warn, error, fatal, panic", s)
	}
	return level, nil
}

// New is the root logger of a binary.
func New(service string, level zerolog.Level) zerolog.Logger {
	return NewTo(os.Stderr, service, level)
}

// NewTo writes to w (tests).
func NewTo(w io.Writer, service string, level zerolog.Level) zerolog.Logger {
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(level).With().Timestamp().Str("service", service).Logger()
}

// WithTrace returns ctx carrying a logger that stamps trace_id.
func WithTrace(ctx context.Context, log zerolog.Logger, traceID string) context.Context {
	return log.With().Str(FieldTraceID, traceID).Logger().WithContext(ctx)
}

// From returns the context's logger (zerolog's disabled logger if none).
func From(ctx context.Context) *zerolog.Logger { return zerolog.Ctx(ctx) }
