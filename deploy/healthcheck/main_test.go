package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(http.StatusOK)
		case "/moved":
			http.Redirect(w, r, "/readyz", http.StatusFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"not ready"}`))
		}
	}))
	defer srv.Close()

	cases := []struct {
		name string
		args []string
		code int
	}{
		{"ready", []string{srv.URL + "/readyz"}, 0},
		{"not ready", []string{srv.URL + "/other"}, 1},
		{"redirect is a failure", []string{srv.URL + "/moved"}, 1},
		{"nothing listening", []string{"http://127.0.0.1:1/readyz"}, 1},
		{"not a URL", []string{"127.0.0.1:8080"}, 1},
		{"no argument", nil, 2},
		{"two arguments", []string{srv.URL, srv.URL}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			require.Equal(t, c.code, run(c.args, &stderr), stderr.String())
			if c.code != 0 {
				require.NotEmpty(t, stderr.String(), "a failure says why")
			}
		})
	}
}
