package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestDatabaseURLNotEchoed: a malformed DATABASE_URL is a usage error
// that never repeats the value: the driver masks the password only where
// it finds it, and a malformed string is where it does not.
func TestDatabaseURLNotEchoed(t *testing.T) {
	for _, url := range []string{
		"host=127.0.0.1 user=settle password=hunter2 topsecretpart dbname=settle",
		"postgres://settle:p@ss:w0rd@127.0.0.1:1/settle?x=%zz",
	} {
		_, err := runCtl(t, url, "check")
		require.ErrorIs(t, err, config.ErrUsage, url)
		for _, piece := range []string{"topsecretpart", "hunter2", "w0rd", "@ss", "127.0.0.1"} {
			require.NotContains(t, err.Error(), piece)
		}
	}
}

// TestErrorIsOneLine: whatever an error's text holds (the driver lists
// each address it tried on a line of its own), stderr gets one line.
func TestErrorIsOneLine(t *testing.T) {
	err := errors.New("connect: context deadline exceeded (last try: failed to connect to `user=settle database=settle`:\n\t127.0.0.1:1 (127.0.0.1): dial error\n\t[::1]:1 (::1): dial error)")
	var stderr bytes.Buffer
	require.Equal(t, 1, exitCode(&stderr, "check", err))
	require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "%q", stderr.String())
	stderr.Reset()
	require.Equal(t, 2, exitCode(&stderr, "check", fmt.Errorf("%w: bad", config.ErrUsage)))
	require.Equal(t, 0, exitCode(&stderr, "check", flag.ErrHelp))
}
