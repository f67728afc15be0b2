package logging_test

import (
	"bytes"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/logging"
)

// TestParseLevel: LOG_LEVEL takes the names its error lists, in any case;
// zerolog's integers and "disabled" would silence every line, errors and
// alerts included, so they are refused like any other value.
func TestParseLevel(t *testing.T) {
	for _, c := range []struct {
		in   string
		want zerolog.Level
	}{
		{"trace", zerolog.TraceLevel},
		{"debug", zerolog.DebugLevel},
		{"info", zerolog.InfoLevel},
		{" Warn ", zerolog.WarnLevel},
		{"ERROR", zerolog.ErrorLevel},
		{"fatal", zerolog.FatalLevel},
		{"panic", zerolog.PanicLevel},
	} {
		level, err := logging.ParseLevel(c.in)
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, level, "%q", c.in)
	}
	for _, bad := range []string{"42", "7", "127", "-1", "0", "disabled", "", "warning", "verbose"} {
		level, err := logging.ParseLevel(bad)
		require.ErrorContains(t, err, "is not one of trace, debug, info, warn, error, fatal, panic", "%q", bad)
		var out bytes.Buffer
		log := logging.NewTo(&out, "worker", level)
		log.Error().Msg("payment event dead-lettered")
		require.NotZero(t, out.Len(), "%q", bad)
	}
}
