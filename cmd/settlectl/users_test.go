package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

// TestUsersCreateSaysInitialBalance: `users create ID --initial` on a user
// that exists still sets the balance (moving it by the difference); the
// output says so rather than only "exists", and a repeat is the same.
func TestUsersCreateSaysInitialBalance(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	out, err := runCtl(t, dsn, "users", "create", "7", "--initial", "ETH=1.5")
	require.NoError(t, err)
	require.Equal(t, "user 7 created\nuser 7: initial ETH balance set to 1.5\n", out)
	for range 2 {
		out, err = runCtl(t, dsn, "users", "create", "7", "--initial", "ETH=2")
		require.NoError(t, err)
		require.Equal(t, "user 7 exists\nuser 7: initial ETH balance set to 2\n", out)
	}
	out, err = runCtl(t, dsn, "users", "create", "7")
	require.NoError(t, err)
	require.Equal(t, "user 7 exists\n", out)
}
