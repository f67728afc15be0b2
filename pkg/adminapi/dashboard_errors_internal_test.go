package adminapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/logging"
)

// TestJSONErrors: what asynqmon answers, through jsonErrors. Successes and
// JSON errors pass as they are; a plain-text error becomes the API's JSON
// error with its status (NOT_FOUND's 500 a 404), internals never shown.
func TestJSONErrors(t *testing.T) {
	for _, c := range []struct {
		name    string
		handler http.HandlerFunc
		status  int
		code    string // "" when the answer passes as it is
		body    string // the error message, or the body that passed
	}{
		{"a page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html></html>"))
		}, http.StatusOK, "", "<html></html>"},
		{"a JSON error", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"bad"}`))
		}, http.StatusBadRequest, "", `{"error":"bad"}`},
		{"read-only", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "API Server is running in read-only mode: DELETE request is not allowed", http.StatusMethodNotAllowed)
		}, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed, "API Server is running in read-only mode: DELETE request is not allowed"},
		{"not found", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `NOT_FOUND: queue "x" does not exist`, http.StatusInternalServerError)
		}, http.StatusNotFound, httpapi.CodeNotFound, "not found"},
		{"an internal error", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "dial tcp 10.0.0.7:6379: connection refused", http.StatusInternalServerError)
		}, http.StatusInternalServerError, httpapi.CodeInternal, "queue dashboard error"},
		{"no text", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
		}, http.StatusBadRequest, httpapi.CodeInvalidRequest, "bad request"},
		{"unprintable text", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "bad\x00query", http.StatusBadRequest)
		}, http.StatusBadRequest, httpapi.CodeInvalidRequest, "bad request"},
		{"a long text", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, strings.Repeat("x", 10*dashboardErrorTextMax), http.StatusBadRequest)
		}, http.StatusBadRequest, httpapi.CodeInvalidRequest, strings.Repeat("x", dashboardErrorTextMax)},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			jsonErrors(c.handler, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/queues/api/x", nil))
			require.Equal(t, c.status, rec.Code)
			if c.code == "" {
				require.Equal(t, c.body, rec.Body.String())
				return
			}
			require.Equal(t, "application/json", strings.Split(rec.Header().Get("Content-Type"), ";")[0])
			var body map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
			require.Equal(t, c.code, body["code"])
			require.Equal(t, c.body, body["error"])
			require.Contains(t, body, "trace_id")
		})
	}
}

// TestJSONErrorsLogNoPrometheusURL: asynqmon's Metrics tab answers a
// failed query with the whole Prometheus URL in its text; the log line
// names its scheme and host only.
func TestJSONErrorsLogNoPrometheusURL(t *testing.T) {
	const prometheus = "http://127.0.0.1:9/prom-path-key-0123456789abcdef"
	var logged bytes.Buffer
	failing := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `failed to fetch "rate(x[5m])": Get "`+prometheus+`/api/v1/query_range?end=1": dial tcp 127.0.0.1:9: connection refused`, http.StatusInternalServerError)
	})
	req := httptest.NewRequest(http.MethodGet, "/admin/queues/api/metrics", nil)
	req = req.WithContext(zerolog.New(&logged).WithContext(req.Context()))
	rec := httptest.NewRecorder()
	jsonErrors(failing, logging.NewRedactor(prometheus)).ServeHTTP(rec, req)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, logged.String(), "http://127.0.0.1:9")
	require.Contains(t, logged.String(), "connection refused")
	require.NotContains(t, logged.String(), "prom-path-key")
	require.NotContains(t, rec.Body.String(), "127.0.0.1")
}
