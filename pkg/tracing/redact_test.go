package tracing

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink for the exporter's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestExportFailureHidesTheEndpointSecrets: a collector that refuses the
// export (401: the ingest key in the path or query is wrong or revoked)
// makes the exporter fail with the whole URL it posted to and the
// collector's answer, which may repeat the path; the log line names the
// collector by scheme and host only and stays short.
func TestExportFailureHidesTheEndpointSecrets(t *testing.T) {
	const key, queryKey = "ingest-key-0123456789abcdef", "query-key-0123456789abcdef"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "no such ingest key on %s\n%s", r.URL.RequestURI(), strings.Repeat("padding ", 8<<10))
	}))
	defer srv.Close()
	for name, env := range map[string]map[string]string{
		"traces endpoint": {EnvTracesEndpoint: srv.URL + "/otlp/" + key + "/v1/traces?token=" + queryKey},
		"endpoint":        {EnvEndpoint: srv.URL + "/otlp/" + key},
	} {
		t.Run(name, func(t *testing.T) {
			for _, name := range []string{EnvEndpoint, EnvTracesEndpoint, EnvDisabled} {
				t.Setenv(name, env[name])
			}
			logs := &lockedBuffer{}
			end := Begin("test", zerolog.New(logs))
			require.True(t, Enabled())
			_, span := Start(context.Background(), "x", Internal)
			span.End()
			end()
			out := logs.String()
			require.Contains(t, out, "401", "the premise: the export failed and was logged")
			require.Contains(t, out, srv.URL, "the collector is named by scheme and host")
			for _, secret := range []string{key, queryKey} {
				require.NotContains(t, out, secret)
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				require.Less(t, len(line), exportErrorMax+512, "the collector's answer is cut")
			}
		})
	}
}
