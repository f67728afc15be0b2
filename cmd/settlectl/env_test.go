package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEnvHelpHidesTheRPCURL: `settlectl env -h` lists the flags with
// their defaults; --rpc's is $ETH_RPC_URL, whose path holds the
// provider's API key, so it is not printed, and is still what an env
// written without --rpc gets.
func TestEnvHelpHidesTheRPCURL(t *testing.T) {
	const secret = "SECRETKEY0123456789abcdef"
	rpcURL := "https://eth-mainnet.example.net/v2/" + secret + "?key=SECRET2SECRET2SECRET2"
	t.Setenv("ETH_RPC_URL", rpcURL)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	helpErr := runEnv(context.Background(), []string{"-h"}, io.Discard)
	os.Stdout = stdout
	require.NoError(t, w.Close())
	help, err := io.ReadAll(r)
	require.NoError(t, err)
	require.True(t, errors.Is(helpErr, flag.ErrHelp), "%v", helpErr)
	require.Contains(t, string(help), "-rpc", "the premise: the flags were listed")
	require.NotContains(t, string(help), secret)
	require.NotContains(t, string(help), "SECRET2")

	path := filepath.Join(t.TempDir(), ".env")
	require.NoError(t, runEnv(context.Background(), []string{"--out", path}, io.Discard))
	written, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(written), "ETH_RPC_URL="+rpcURL+"\n", "without --rpc, ETH_RPC_URL is used")
}
