package logging_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/logging"
)

func TestURLKeepsSchemeAndHostOnly(t *testing.T) {
	for raw, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/SECRET":        "https://hooks.slack.com",
		"http://user:pw@127.0.0.1:8080/hooks/SECRET?token=abc": "http://127.0.0.1:8080",
		"redis://:pw@redis:6379/0":                             "redis://redis:6379",
		"postgres://settle:pw@db:5432/settle?sslmode=disable":  "postgres://db:5432",
		"redis-sentinel://s1:26379,s2:26379/mymaster/0":        "redis-sentinel://s1:26379,s2:26379",
		"not a url":  "[redacted]",
		"":           "[redacted]",
		"/just/path": "[redacted]",
		"%zz":        "[redacted]",
	} {
		require.Equal(t, want, logging.URL(raw), raw)
	}
}

func TestRedactErrorStripsTheURLOfAClientError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/hooks/SECRETPATH123?k=SECRETQUERY"
	srv.Close() // refused from now on
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err)
	require.Contains(t, err.Error(), "SECRETPATH123", "the premise: net/http embeds the URL")

	red := logging.RedactError(errors.Join(errors.New("delivery"), err))
	require.NotContains(t, red.Error(), "SECRETPATH123")
	require.NotContains(t, red.Error(), "SECRETQUERY")
	require.Contains(t, red.Error(), strings.TrimPrefix(srv.URL, "http://"))
	require.ErrorIs(t, red, syscall.ECONNREFUSED, "the kind of error survives")

	plain := errors.New("no url here")
	require.Same(t, plain, logging.RedactError(plain))
	require.NoError(t, logging.RedactError(nil))
}

// TestRedactErrorStripsEveryURLOfAJoinedError: several client errors in
// one (errors.Join of two endpoints' failures, or one wrapped in another)
// are all reduced, not only the first one errors.As finds.
func TestRedactErrorStripsEveryURLOfAJoinedError(t *testing.T) {
	a := &url.Error{Op: "Post", URL: "https://a.example/v2/KEYONE", Err: errors.New("timeout")}
	b := &url.Error{Op: "Post", URL: "https://b.example/v2/KEYTWO", Err: errors.New("refused")}
	nested := &url.Error{Op: "Get", URL: "https://c.example/KEYTHREE", Err: fmt.Errorf("retry: %w", b)}
	for _, err := range []error{
		errors.Join(a, b),
		fmt.Errorf("networks: %w", errors.Join(errors.New("x"), fmt.Errorf("base: %w", a), b)),
		nested,
	} {
		red := logging.RedactError(err).Error()
		for _, secret := range []string{"KEYONE", "KEYTWO", "KEYTHREE"} {
			require.NotContains(t, red, secret, "%q", red)
		}
	}
}

// TestRedactorHidesAnEndpointsSecretsAnywhere: the path (raw and
// escaped), the query, the user info and key-like pieces of them leave
// any text, wherever a server or library repeated them; trivial parts
// ("/", a short path) that would mangle ordinary words are not touched.
func TestRedactorHidesAnEndpointsSecretsAnywhere(t *testing.T) {
	r := logging.NewRedactor("https://user:pa55word@node.example/v3/KEY0123456789abcdef/x%2Fy?apikey=QKEY0123456789abcdef&n=1")
	for text, want := range map[string]string{
		"Post \"https://user:pa55word@node.example/v3/KEY0123456789abcdef/x%2Fy?apikey=QKEY0123456789abcdef&n=1\": 404": "Post \"https://node.example\": 404",
		"The requested URL /v3/KEY0123456789abcdef/x%2Fy?apikey=QKEY0123456789abcdef&n=1 was not found":                 "The requested URL [redacted] was not found",
		`{"path":"/v3/KEY0123456789abcdef/x/y"}`:    `{"path":"[redacted]"}`,
		"URI: /v3/KEY0123456789abcdef/x%2Fy":        "URI: [redacted]",
		"invalid project id KEY0123456789abcdef":    "invalid project id [redacted]",
		"bad key QKEY0123456789abcdef":              "bad key [redacted]",
		"user user:pa55word, password pa55word":     "user [redacted], password [redacted]",
		"/ is fine, and so are v3, x and n=1 alone": "/ is fine, and so are v3, x and n=1 alone",
	} {
		require.Equal(t, want, r.String(text), text)
	}

	root := logging.NewRedactor("http://127.0.0.1:8545/")
	require.Equal(t, "POST / 404, path /", root.String("POST / 404, path /"), "a bare / is no secret")
	require.Equal(t, "x", (*logging.Redactor)(nil).String("x"))

	base := errors.New("404 Not Found: <p>The requested URL /v3/KEY0123456789abcdef/x%2Fy was not found</p>")
	wrapped := fmt.Errorf("call: %w", base)
	red := r.Error(wrapped)
	require.Equal(t, "call: 404 Not Found: <p>The requested URL [redacted] was not found</p>", red.Error())
	require.ErrorIs(t, red, base, "the chain is kept")
	plain := errors.New("nothing secret")
	require.Same(t, plain, r.Error(plain))
	require.NoError(t, r.Error(nil))
}
