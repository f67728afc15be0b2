package config_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

func TestSecretRefusesPlaceholdersAndWeakValues(t *testing.T) {
	for _, weak := range []string{
		"change-me-webhook-secret-0123456789abcdef", // compose's old default
		"CHANGE-ME-api-token-at-least-32-characters-long",
		"a-placeholder-that-is-long-enough-0123456789",
		"https://example.com/not-a-secret-but-long-enough",
		strings.Repeat("a", 40),
		strings.Repeat("ab", 20),
	} {
		env := config.FromMap(map[string]string{"WEBHOOK_SECRET": weak})
		env.Secret("WEBHOOK_SECRET", 32)
		require.Len(t, env.Errs(), 1, weak)
		require.ErrorContains(t, env.Err(), "setting WEBHOOK_SECRET:")
		require.NotContains(t, env.Err().Error(), weak, "the value itself is never printed")
		require.NotContains(t, env.Err().Error(), "\n")
	}
	env := config.FromMap(map[string]string{"WEBHOOK_SECRET": "3f9c1a7be04d2c58a6e1f0b9d7c3a2e5"})
	require.Equal(t, "3f9c1a7be04d2c58a6e1f0b9d7c3a2e5", env.Secret("WEBHOOK_SECRET", 32))
	require.NoError(t, env.Err())
	require.Empty(t, config.WeakSecret("test-webhook-secret-0123456789abcdef"))
}

// TestSecretCountsCharacters: the length a secret's refusal names is in
// characters, as it says, and a refused secret is not handed back.
func TestSecretCountsCharacters(t *testing.T) {
	short := strings.Repeat("é", 10) + "0123456789abcdef" // 26 characters, 36 bytes
	env := config.FromMap(map[string]string{"WEBHOOK_SECRET": short})
	require.Empty(t, env.Secret("WEBHOOK_SECRET", 32))
	require.EqualError(t, env.Err(), "setting WEBHOOK_SECRET: must be at least 32 characters, got 26")

	long := strings.Repeat("é", 16) + "0123456789abcdef" // 32 characters
	env = config.FromMap(map[string]string{"WEBHOOK_SECRET": long})
	require.Equal(t, long, env.Secret("WEBHOOK_SECRET", 32))
	require.NoError(t, env.Err())

	env = config.FromMap(map[string]string{"WEBHOOK_SECRET": strings.Repeat("ab", 20)})
	require.Empty(t, env.Secret("WEBHOOK_SECRET", 32), "a weak secret was handed back")
	require.Error(t, env.Err())
}

// TestOneOfIgnoresSpaces: a choice read from a file with a trailing space
// is the choice, as a number or a flag would be.
func TestOneOfIgnoresSpaces(t *testing.T) {
	env := config.FromMap(map[string]string{"SCAN_TRACES": " on\t", "LOG_LEVEL": "o n"})
	require.Equal(t, "on", env.OneOf("SCAN_TRACES", "off", "on", "off"))
	require.Equal(t, "info", env.OneOf("LOG_LEVEL", "info", "debug", "info"))
	require.EqualError(t, env.Err(), `setting LOG_LEVEL: "o n" is not one of debug, info`)
}

func TestBadURLIsNotPrinted(t *testing.T) {
	env := config.FromMap(map[string]string{"ALERT_WEBHOOK_URL": "hooks.example/SECRETPATH"})
	env.URL("ALERT_WEBHOOK_URL", "", "https")
	require.ErrorContains(t, env.Err(), "ALERT_WEBHOOK_URL")
	require.NotContains(t, env.Err().Error(), "SECRETPATH")
}

func TestAnyPlaceholderSettingIsRefused(t *testing.T) {
	env := config.FromMap(map[string]string{
		"DATABASE_URL": "postgres://settle:CHANGE-ME@postgres.example.internal:5432/settle",
		"ETH_RPC_URL":  "https://CHANGE-ME.example.invalid/eth-mainnet",
		"REDIS_URL":    "redis://:replace_me@redis:6379/0",
	})
	require.Empty(t, env.Required("DATABASE_URL"))
	require.Empty(t, env.URL("ETH_RPC_URL", "", "https"))
	require.Equal(t, "redis://localhost:6379/0", env.String("REDIS_URL", "redis://localhost:6379/0"))
	require.Len(t, env.Errs(), 3, "%v", env.Errs())
	require.ErrorContains(t, env.Err(), "setting DATABASE_URL: is a placeholder")
	for _, err := range env.Errs() {
		require.NotContains(t, err.Error(), "example.invalid")
	}
	// "example" alone is not a placeholder outside secrets.
	env = config.FromMap(map[string]string{"ALERT_WEBHOOK_URL": "https://hooks.example.com/x"})
	require.Equal(t, "https://hooks.example.com/x", env.URL("ALERT_WEBHOOK_URL", "", "https"))
	require.NoError(t, env.Err())
}

// A listen address that could never be bound is refused with the
// settings, naming the setting.
func TestListenAddress(t *testing.T) {
	for _, ok := range []string{":8080", "127.0.0.1:9091", "[::1]:0", "localhost:65535"} {
		_, err := config.ListenAddress(ok)
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"garbage", "8080", ":", ":99999", ":-1", ":http", "host:port"} {
		_, err := config.ListenAddress(bad)
		require.Error(t, err, bad)
	}
	env := config.FromMap(map[string]string{"METRICS_ADDR": ":99999"})
	require.Equal(t, ":9091", config.Parse(env, "METRICS_ADDR", ":9091", config.ListenAddress))
	require.ErrorContains(t, env.Err(), "METRICS_ADDR")
}
