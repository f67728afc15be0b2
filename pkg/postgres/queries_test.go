package postgres

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestStatusWritesMustDeclareTheirTransition(t *testing.T) {
	files := fstest.MapFS{"queries/x.sql": {Data: []byte("-- name: sneaky\nUPDATE payment_events SET status = 'confirmed' WHERE event_id = $1;\n")}}
	_, err := parseQueries(files)
	require.ErrorContains(t, err, "without a -- transition: line")

	files = fstest.MapFS{"queries/x.sql": {Data: []byte("-- name: bad\n-- transition: confirmed -> pending\nUPDATE payment_events SET status = 'pending';\n")}}
	_, err = parseQueries(files)
	require.ErrorContains(t, err, "not an allowed transition")

	files = fstest.MapFS{"queries/x.sql": {Data: []byte("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")}}
	_, err = parseQueries(files)
	require.ErrorContains(t, err, "defined twice")
}

// TestAmountArraysAreDeclaredText: pgx sends a []string declared
// numeric[] only after failing to encode it in binary, on every call.
func TestAmountArraysAreDeclaredText(t *testing.T) {
	for _, text := range []string{"SELECT * FROM unnest($1::numeric[]);", "SELECT * FROM unnest($12 :: NUMERIC []);", "SELECT $2::decimal[];"} {
		_, err := parseQueries(fstest.MapFS{"queries/x.sql": {Data: []byte("-- name: amounts\n" + text + "\n")}})
		require.ErrorContains(t, err, "declares a numeric[] parameter", text)
	}
	parsed, err := parseQueries(fstest.MapFS{"queries/x.sql": {Data: []byte("-- name: amounts\nSELECT * FROM unnest($1::text[]::numeric[]), $2::numeric;\n")}})
	require.NoError(t, err)
	require.Contains(t, parsed, "amounts")
}

// TestEveryQueryIsUsed: a statement in queries/*.sql that no Go code asks
// for is dead SQL, and a name asked for but missing would panic at init.
func TestEveryQueryIsUsed(t *testing.T) {
	sources, err := filepath.Glob("*.go")
	require.NoError(t, err)
	used := map[string]bool{}
	// q("name") calls, and names listed in tables (invariantChecks).
	call := regexp.MustCompile(`(?:\bq\(|query:\s*)"([a-z0-9_]+)"`)
	for _, path := range sources {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range call.FindAllStringSubmatch(string(data), -1) {
			used[m[1]] = true
		}
	}
	for name := range queriesByName {
		require.True(t, used[name], "query %q is never used", name)
		require.Regexp(t, `^[a-z][a-z0-9_]*$`, name)
	}
	for name := range used {
		_, ok := queriesByName[name]
		require.True(t, ok, "query %q is used but not defined", name)
	}
}
