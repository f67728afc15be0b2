//go:build dev

package main

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestDevRefusesBadFlagsFirst: `settlectl dev` with a bad --finality, port
// or network is a usage error before it builds or starts anything (a bad
// policy surfaced a minute later as the worker's exit).
func TestDevRefusesBadFlagsFirst(t *testing.T) {
	for _, args := range [][]string{
		{"--finality", "bogus"},
		{"--finality", "confirmations:-1"},
		{"--postgres-port", "-1"},
		{"--redis-port", "99999"},
		{"--networks", "NOPE"},
	} {
		err := runDev(context.Background(), append([]string{"--dir", t.TempDir()}, args...), io.Discard)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl dev %q", args)
	}
}
