package worker

import (
	"fmt"

	"github.com/rs/zerolog"
)

// AsynqLogger routes asynq's own log lines into zerolog.
type AsynqLogger struct{ Log zerolog.Logger }

func (l AsynqLogger) Debug(args ...any) {
	l.Log.Debug().Str("component", "asynq").Msg(fmt.Sprint(args...))
}
func (l AsynqLogger) Info(args ...any) {
	l.Log.Info().Str("component", "asynq").Msg(fmt.Sprint(args...))
}
func (l AsynqLogger) Warn(args ...any) {
	l.Log.Warn().Str("component", "asynq").Msg(fmt.Sprint(args...))
}
func (l AsynqLogger) Error(args ...any) {
	l.Log.Error().Str("component", "asynq").Msg(fmt.Sprint(args...))
}

// Fatal is asynq's "cannot continue"; asynq calls os.Exit after it.
func (l AsynqLogger) Fatal(args ...any) {
	l.Log.WithLevel(zerolog.FatalLevel).Str("component", "asynq").Msg(fmt.Sprint(args...))
}
