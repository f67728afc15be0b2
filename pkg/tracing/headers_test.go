package tracing

import (
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// captureStderr runs fn with file descriptor 2 on a pipe: otel's own
// logger holds the os.Stderr of its init, so only the descriptor catches
// what it prints.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved, err := syscall.Dup(2)
	require.NoError(t, err)
	require.NoError(t, syscall.Dup3(int(w.Fd()), 2, 0))
	read := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	func() {
		defer func() {
			require.NoError(t, syscall.Dup3(saved, 2, 0))
			_ = syscall.Close(saved)
			_ = w.Close()
		}()
		fn()
	}()
	out := <-read
	_ = r.Close()
	return out
}

// TestMalformedHeadersAreNotPrinted: OTEL_EXPORTER_OTLP_HEADERS holds the
// collector's credentials; an entry the exporter cannot parse (a ':' for
// '=', a stray '%') was printed whole on stderr by otel's own logger and
// dropped, tracing running on without it. It is refused instead, naming
// the setting and the entry's place, never its text.
func TestMalformedHeadersAreNotPrinted(t *testing.T) {
	const secret = "HEADERSECRET0123456789"
	for name, tc := range map[string]struct{ setting, value string }{
		"colon for equals":  {EnvHeaders, "x-api-key:" + secret},
		"stray percent":     {EnvHeaders, "x-ok=1,authorization=Bearer%zz" + secret},
		"traces, no name":   {EnvTracesHeaders, "=" + secret},
		"traces, bad name":  {EnvTracesHeaders, "x-api-key " + secret + "=1"},
		"empty entry after": {EnvHeaders, "x-api-key=" + secret + ",,x=1"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(EnvEndpoint, "http://127.0.0.1:1")
			t.Setenv(EnvTracesEndpoint, "")
			t.Setenv(EnvDisabled, "")
			t.Setenv(EnvHeaders, "")
			t.Setenv(EnvTracesHeaders, "")
			t.Setenv(tc.setting, tc.value)
			logs := &lockedBuffer{}
			stderr := captureStderr(t, func() {
				end := Begin("test", zerolog.New(logs))
				end()
			})
			require.NotContains(t, stderr, secret, "stderr")
			require.NotContains(t, logs.String(), secret, "log")
			require.False(t, Enabled(), "refused: tracing stays off")
			require.Contains(t, logs.String(), "tracing not set up")
			require.Contains(t, logs.String(), tc.setting)
		})
	}
	t.Run("well formed", func(t *testing.T) {
		t.Setenv(EnvEndpoint, "http://127.0.0.1:1")
		t.Setenv(EnvTracesEndpoint, "")
		t.Setenv(EnvDisabled, "")
		t.Setenv(EnvHeaders, "x-api-key="+secret+", authorization=Basic%20YWJj")
		t.Setenv(EnvTracesHeaders, "")
		stderr := captureStderr(t, func() {
			end := Begin("test", zerolog.Nop())
			require.True(t, Enabled())
			end()
		})
		require.NotContains(t, stderr, secret)
	})
}
