package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/settle/settle/test/deploy/deployenv"
)

// composeTool is a compose implementation's argv: the Docker plugin or
// Debian's docker-compose (`config` needs no daemon). Without one the
// test skips, except in CI (CI=true), whose .ci/run installs
// docker-compose: there it fails.
func composeTool(t *testing.T) []string {
	t.Helper()
	if err := exec.Command("docker", "compose", "version").Run(); err == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no docker compose plugin and no docker-compose in CI: .ci/run installs Debian's docker-compose")
	}
	t.Skip("no docker compose plugin and no docker-compose: the parse tests still run")
	return nil
}

// TestComposeEnvironmentAsComposeReadsIt: the environment the settings
// tests (cmd/*/deploy_settings_test.go) run through the binaries is the
// one compose itself resolves from compose.yaml and a .env, service by
// service, in every scenario.
func TestComposeEnvironmentAsComposeReadsIt(t *testing.T) {
	argv := composeTool(t)
	root := repoRoot(t)
	for _, sc := range deployenv.Scenarios() {
		ours, err := deployenv.Compose(root, sc.Vars)
		require.NoError(t, err, sc.Name)
		require.NotEmpty(t, ours, sc.Name)

		var lines []string
		for k, v := range sc.Vars {
			lines = append(lines, k+"="+v)
		}
		sort.Strings(lines)
		dotEnv := filepath.Join(t.TempDir(), ".env")
		require.NoError(t, os.WriteFile(dotEnv, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := append(argv[1:], "--env-file", dotEnv, "-f", filepath.Join(root, "compose.yaml"), "config")
		cmd := exec.CommandContext(ctx, argv[0], args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
		cmd.Dir = t.TempDir()
		out, err := cmd.Output()
		cancel()
		require.NoError(t, err, "%s: %s config", sc.Name, strings.Join(argv, " "))

		var resolved struct {
			Services map[string]struct {
				Environment map[string]*string `yaml:"environment"`
			} `yaml:"services"`
		}
		require.NoError(t, yaml.Unmarshal(out, &resolved), sc.Name)
		for _, p := range ours {
			service := strings.TrimPrefix(p.Source, "compose.yaml service ")
			theirs := map[string]string{}
			for k, v := range resolved.Services[service].Environment {
				if v != nil {
					theirs[k] = *v
				} else {
					theirs[k] = ""
				}
			}
			require.Equal(t, theirs, p.Env, "%s: service %s", sc.Name, service)
		}
	}
}
