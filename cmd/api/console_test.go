package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// The console's settings are checked like every other: a bad one stops
// the api at once, naming it, never printing the token.
func TestConsoleSettings(t *testing.T) {
	readOnly := "r3ad-0nly-t0ken-9a8b7c6d5e4f30211203"
	cases := map[string]struct {
		change map[string]string
		want   string
	}{
		"short read-only token":        {map[string]string{"ADMIN_READONLY_TOKEN": "short"}, "ADMIN_READONLY_TOKEN"},
		"read-only token is the admin": {map[string]string{"ADMIN_READONLY_TOKEN": testAdminToken}, "ADMIN_READONLY_TOKEN"},
		"read-only token is the api's": {map[string]string{"ADMIN_READONLY_TOKEN": validSettings()["API_TOKEN"]}, "ADMIN_READONLY_TOKEN"},
		"placeholder read-only token":  {map[string]string{"ADMIN_READONLY_TOKEN": "change-me-readonly-token-0123456789"}, "ADMIN_READONLY_TOKEN"},
		"trace url without its id":     {map[string]string{"TRACE_UI_URL": "https://jaeger.example/search"}, "TRACE_UI_URL"},
		"trace url not http":           {map[string]string{"TRACE_UI_URL": "ftp://jaeger.example/{trace_id}"}, "TRACE_UI_URL"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			env := validSettings()
			for k, v := range tc.change {
				env[k] = v
			}
			var out bytes.Buffer
			require.Equal(t, exitFailure, run(nil, config.FromMap(env), &out))
			require.Equal(t, 1, strings.Count(out.String(), "\n"), "one line: %q", out.String())
			require.Contains(t, out.String(), tc.want)
			require.NotContains(t, out.String(), testAdminToken)
			require.NotContains(t, out.String(), "change-me-readonly")
		})
	}
	env := config.FromMap(map[string]string{"ADMIN_READONLY_TOKEN": readOnly, "TRACE_UI_URL": "https://jaeger.example/trace/{trace_id}"})
	s := readConsole(env, testAdminToken, "api-t0ken-1f2e3d4c5b6a798807162534")
	require.Equal(t, consoleSettings{readOnlyToken: readOnly, traceURL: "https://jaeger.example/trace/{trace_id}"}, s)
}
