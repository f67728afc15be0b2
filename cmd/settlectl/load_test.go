//go:build dev

package main

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/testenv"
)

// TestDevLoadBadValuesAreUsageErrors: a bad value of a load flag is a usage
// error (exit 2) as for every other command, found before anything is
// seeded or sent (the api named here is never asked).
func TestDevLoadBadValuesAreUsageErrors(t *testing.T) {
	t.Setenv("DATABASE_URL", testenv.DatabaseURL(t))
	t.Setenv("WEBHOOK_SECRET", "s")
	t.Setenv("ADMIN_TOKEN", "a")
	for _, args := range [][]string{
		{"--events", "-1"},
		{"--events", "20000000"},
		{"--concurrency", "0"},
		{"--users", "0"},
		{"--withdrawals", "101"},
		{"--holds", "-1"},
		{"--withdrawals", "60", "--holds", "50"},
		{"--initial-balance", "lots"},
		{"--initial-balance", "-5"},
		{"--rate", "-5"},
		{"--rate", "NaN"},
		{"--assets", "ETH,,USDC"},
		{"--user-base", "-3"},
		{"--wait", "-1s"},
		{"--api", "127.0.0.1:1"},
	} {
		err := runLoad(context.Background(), append([]string{"--api", "http://127.0.0.1:1", "--quiet"}, args...), io.Discard)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl load %q", args)
	}
}
