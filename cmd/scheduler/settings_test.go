package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestListenURLIsChecked: a malformed DATABASE_LISTEN_URL stops the
// scheduler at start naming the setting (else LISTEN fails forever while
// the enqueuer runs on its poll alone), without repeating the password;
// unset, the listener uses DATABASE_URL.
func TestListenURLIsChecked(t *testing.T) {
	for _, bad := range []string{
		"postgres://settle:hunter2@db:notaport/settle",
		"postgres://settle:hunter2@db/settle?sslmode=sometimes",
		"http://db.example/settle",
	} {
		env := config.FromMap(map[string]string{
			"DATABASE_URL":        "postgres://settle@db/settle",
			"DATABASE_LISTEN_URL": bad,
		})
		readSettings(env)
		require.Len(t, env.Errs(), 1, "DATABASE_LISTEN_URL=%q", bad)
		require.ErrorContains(t, env.Err(), "setting DATABASE_LISTEN_URL", "DATABASE_LISTEN_URL=%q is accepted", bad)
		require.NotContains(t, env.Err().Error(), "hunter2")
	}

	env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@db/settle"})
	require.Equal(t, "postgres://settle@db/settle", readSettings(env).ListenURL)
	require.NoError(t, env.Err())
	env = config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@pgbouncer/settle", "DATABASE_LISTEN_URL": "postgres://settle@db/settle"})
	require.Equal(t, "postgres://settle@db/settle", readSettings(env).ListenURL)
	require.NoError(t, env.Err())
}
