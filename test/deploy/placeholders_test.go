package deploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

// runSettings runs a binary with only env and returns its output and exit
// code; the settings check comes before any connection.
func runSettings(t *testing.T, binary string, env map[string]string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.Binaries(t), binary))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		return string(out), 0
	}
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, binary)
	return string(out), exitErr.ExitCode()
}

// requireRefused: the binary exits at once with one line naming the
// setting, and the refused value is not printed.
func requireRefused(t *testing.T, binary string, env map[string]string, setting string) {
	t.Helper()
	out, code := runSettings(t, binary, env)
	require.NotZero(t, code, "%s started with %s=%q:\n%s", binary, setting, env[setting], out)
	require.Equal(t, 1, strings.Count(out, "\n"), "%s: one line: %q", binary, out)
	require.Contains(t, out, setting, binary)
	if v := env[setting]; v != "" {
		require.NotContains(t, out, v, "%s printed the refused value", binary)
	}
}

// The placeholders this repository ships (deploy/k8s/secret.yaml, and the
// defaults compose.yaml used to carry) never start a binary.
func TestBinariesRefuseShippedPlaceholders(t *testing.T) {
	secret := loadManifests(t, "").secrets["settle-secrets"]
	require.NotNil(t, secret, "deploy/k8s defines settle-secrets")
	api := map[string]string{
		// Nothing listens there: the settings check must refuse first.
		"DATABASE_URL":   "postgres://settle@127.0.0.1:1/settle",
		"REDIS_URL":      "redis://127.0.0.1:1/0",
		"WEBHOOK_SECRET": "9b1e0c7d3f5a4e2b8c6d0f1a3e5b7c9d",
		"API_TOKEN":      "4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e",
		"ADMIN_TOKEN":    "7d9f1b3e5a7c9e1b3d5f7a9c1e3b5d7f",
	}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for key, val := range base {
			out[key] = val
		}
		out[k] = v
		return out
	}
	for _, name := range []string{"WEBHOOK_SECRET", "API_TOKEN", "ADMIN_TOKEN"} {
		placeholder := secret.StringData[name]
		require.NotEmpty(t, placeholder, "secret.yaml ships a placeholder for %s", name)
		requireRefused(t, "api", with(api, name, placeholder), name)
	}
	for name, old := range map[string]string{
		"WEBHOOK_SECRET": "change-me-webhook-secret-0123456789abcdef",
		"API_TOKEN":      "change-me-api-token-0123456789abcdef",
		"ADMIN_TOKEN":    strings.Repeat("a", 40),
	} {
		requireRefused(t, "api", with(api, name, old), name)
	}

	worker := map[string]string{
		"DATABASE_URL": "postgres://settle@127.0.0.1:1/settle", "REDIS_URL": "redis://127.0.0.1:1/0",
		"DEPOSIT_FINALITY": "none", "NOTIFY_WEBHOOK_URL": "https://hooks.test.invalid/SECRETPATH",
	}
	requireRefused(t, "worker", worker, "NOTIFY_WEBHOOK_SECRET")
	for _, weak := range []string{
		"CHANGE-ME-notify-secret-at-least-32-characters",
		strings.Repeat("n", 40),
		"too-short-a-secret",
		"whsec_c2hvcnQ=", // 5 bytes
	} {
		requireRefused(t, "worker", with(worker, "NOTIFY_WEBHOOK_SECRET", weak), "NOTIFY_WEBHOOK_SECRET")
	}
	// The URL placeholders of secret.yaml too, in every binary reading them.
	for _, name := range []string{"DATABASE_URL", "REDIS_URL", "ETH_RPC_URL"} {
		placeholder := secret.StringData[name]
		require.Contains(t, strings.ToLower(placeholder), "change-me", "secret.yaml's %s is a visible placeholder", name)
		env := with(worker, name, placeholder)
		delete(env, "NOTIFY_WEBHOOK_URL")
		env["DEPOSIT_FINALITY"] = "finalized"
		if name != "ETH_RPC_URL" {
			env["ETH_RPC_URL"] = "http://127.0.0.1:1/"
		}
		requireRefused(t, "worker", env, name)
		if name != "ETH_RPC_URL" {
			requireRefused(t, "api", with(api, name, placeholder), name)
		}
	}
	out, _ := runSettings(t, "worker", worker)
	require.NotContains(t, out, "SECRETPATH", "the URL is never printed")
}
