package service

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestSettingsProblemsNamesEveryBadSetting: one line, every bad setting,
// so an operator fixes them all in one go.
func TestSettingsProblemsNamesEveryBadSetting(t *testing.T) {
	env := config.FromMap(map[string]string{"SHUTDOWN_TIMEOUT": "soon", "LOG_LEVEL": "loud"})
	_ = env.Duration("SHUTDOWN_TIMEOUT", time.Second)
	env.Reject("LOG_LEVEL", errLoud)
	line := SettingsProblems("worker", env)
	require.NotContains(t, line, "\n")
	for _, name := range []string{"worker: ", "SHUTDOWN_TIMEOUT", "LOG_LEVEL"} {
		require.Contains(t, line, name)
	}
	require.Empty(t, SettingsProblems("worker", config.FromMap(nil)))
}

var errLoud = errors.New("not a level")

// TestDatabaseURLIsChecked: a DATABASE_URL the driver would refuse is a
// settings problem naming it, and the line does not repeat the password.
func TestDatabaseURLIsChecked(t *testing.T) {
	env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle:hunter2@db:notaport/settle"})
	ReadCommon(env)
	line := SettingsProblems("worker", env)
	require.Contains(t, line, "setting DATABASE_URL: invalid port")
	require.NotContains(t, line, "hunter2")

	env = config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle:hunter2@db:5432/settle"})
	ReadCommon(env)
	require.NoError(t, env.Err())
}
