package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/test/harness"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
	// Extensions holds the top-level x- keys (anchors for the services).
	Extensions map[string]any `yaml:",inline"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	Healthcheck *composeHealth    `yaml:"healthcheck"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Deploy *struct {
		Replicas *int `yaml:"replicas"`
	} `yaml:"deploy"`
	Restart         string   `yaml:"restart"`
	ReadOnly        bool     `yaml:"read_only"`
	SecurityOpt     []string `yaml:"security_opt"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
}

type composeBuild struct {
	Context    string            `yaml:"context"`
	Dockerfile string            `yaml:"dockerfile"`
	Args       map[string]string `yaml:"args"`
}

type composeHealth struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	Retries     int      `yaml:"retries"`
	StartPeriod string   `yaml:"start_period"`
}

// composeServices are the services the deployment issue asks for.
var composeServices = []string{"postgres", "redis", "migrate", "api", "worker", "scheduler", "prometheus", "grafana"}

// loadCompose reads compose.yaml the way compose does with the .env
// `settlectl env` writes (composeEnv): YAML first (anchors and merge keys),
// then ${VAR:-default} in every scalar.
func loadCompose(t *testing.T) composeFile {
	t.Helper()
	return loadComposeWith(t, composeEnv(t))
}

func loadComposeWith(t *testing.T, env map[string]string) composeFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "compose.yaml"))
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	interpolateNode(t, &doc, env, nil)
	var cf composeFile
	dec := yaml.NewDecoder(strings.NewReader(mustMarshal(t, &doc)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cf), "compose.yaml has a field this test does not know (or a typo)")
	for key := range cf.Extensions {
		require.True(t, strings.HasPrefix(key, "x-"), "unknown top-level key %q in compose.yaml", key)
	}
	return cf
}

// composeEnv is what `settlectl env --rpc ...` writes, read back.
func composeEnv(t *testing.T) map[string]string {
	t.Helper()
	path := filepath.Join(t.TempDir(), ".env")
	out, err := exec.Command(filepath.Join(harness.Binaries(t), "settlectl"), "env", "--out", path, "--rpc", "https://rpc.test.invalid/v2/key").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return readDotEnv(t, path)
}

func readDotEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	env := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s: %q is not NAME=value", path, line)
		env[k] = v
	}
	return env
}

func mustMarshal(t *testing.T, n *yaml.Node) string {
	t.Helper()
	// Resolve anchors and merges into plain values first, so the re-encoded
	// document holds no aliases.
	var plain any
	require.NoError(t, n.Decode(&plain))
	out, err := yaml.Marshal(plain)
	require.NoError(t, err)
	return string(out)
}

var composeVar = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)

// interpolateNode applies compose's variable syntax to every scalar with
// env as the environment: ${X:-d} gives d when X is unset or empty, ${X-d}
// when unset, ${X} gives X or "", and ${X:?e} / ${X?e} fail the test when
// X is unset (or empty, with the colon) unless missing collects them.
func interpolateNode(t *testing.T, n *yaml.Node, env map[string]string, missing map[string]bool) {
	t.Helper()
	if n.Kind == yaml.ScalarNode {
		n.Value = composeVar.ReplaceAllStringFunc(n.Value, func(m string) string {
			if m == "$$" {
				return "$"
			}
			parts := composeVar.FindStringSubmatch(m)
			v, set := env[parts[1]]
			switch parts[2] {
			case ":-":
				if v == "" {
					return parts[3]
				}
			case "-":
				if !set {
					return parts[3]
				}
			case ":?", "?":
				if !set || parts[2] == ":?" && v == "" {
					if missing == nil {
						t.Fatalf("compose.yaml requires %s (%s), which the generated .env does not set", parts[1], m)
					}
					missing[parts[1]] = true
				}
			}
			return v
		})
	}
	for _, c := range n.Content {
		interpolateNode(t, c, env, missing)
	}
}

// Without a .env compose refuses to start, naming every secret; no secret
// has a default in the file.
func TestComposeSecretsComeFromDotEnv(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "compose.yaml"))
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	missing := map[string]bool{}
	interpolateNode(t, &doc, map[string]string{}, missing)
	for _, name := range []string{"WEBHOOK_SECRET", "API_TOKEN", "ADMIN_TOKEN", "POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "ETH_RPC_URL"} {
		require.True(t, missing[name], "compose.yaml must require %s from .env (${%s:?...})", name, name)
	}
	for _, m := range composeVar.FindAllStringSubmatch(string(raw), -1) {
		if strings.Contains(m[1], "SECRET") || strings.Contains(m[1], "TOKEN") || strings.Contains(m[1], "PASSWORD") || strings.Contains(m[1], "KEY") {
			require.False(t, (m[2] == ":-" || m[2] == "-") && m[3] != "", "%s has a default value in compose.yaml: %s", m[1], m[0])
		}
	}
	lower := strings.ToLower(string(raw))
	for _, mark := range []string{"change-me", "changeme", "dev-password"} {
		require.NotContains(t, lower, mark, "a placeholder secret is committed in compose.yaml")
	}

	// The generated .env: every secret random and accepted by the binaries'
	// checks, the two tokens different, the file private.
	path := filepath.Join(t.TempDir(), ".env")
	settlectl := filepath.Join(harness.Binaries(t), "settlectl")
	out, err := exec.Command(settlectl, "env", "--out", path, "--rpc", "https://rpc.test.invalid/v2/key").CombinedOutput()
	require.NoError(t, err, "%s", out)
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	env := readDotEnv(t, path)
	for _, name := range []string{"WEBHOOK_SECRET", "API_TOKEN", "ADMIN_TOKEN"} {
		require.GreaterOrEqual(t, len(env[name]), secretLengthMin, name)
		require.Empty(t, config.WeakSecret(env[name]), name)
	}
	require.NotEqual(t, env["API_TOKEN"], env["ADMIN_TOKEN"])
	require.Equal(t, "finalized", env["DEPOSIT_FINALITY"])
	_, err = notify.ParseSecret(env["NOTIFY_WEBHOOK_SECRET"])
	require.NoError(t, err)

	// An existing .env is never overwritten; without an RPC endpoint only
	// an explicit --finality none writes one.
	out, err = exec.Command(settlectl, "env", "--out", path, "--rpc", "https://rpc.test.invalid/v2/key").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Equal(t, env, readDotEnv(t, path), "kept as it was")
	other := filepath.Join(t.TempDir(), ".env")
	cmd := exec.Command(settlectl, "env", "--out", other)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "--rpc")
	require.NoFileExists(t, other)
	out, err = exec.Command(settlectl, "env", "--out", other, "--finality", "none").CombinedOutput()
	require.NoError(t, err, "%s", out)
	trial := readDotEnv(t, other)
	require.Equal(t, "none", trial["DEPOSIT_FINALITY"])
	require.Equal(t, "", trial["ETH_RPC_URL"])
	require.NotEqual(t, env["ADMIN_TOKEN"], trial["ADMIN_TOKEN"], "random every time")
}

// Every published port is on the loopback address.
func TestComposePortsAreLocal(t *testing.T) {
	for name, svc := range loadCompose(t).Services {
		for _, p := range svc.Ports {
			host, ip := publishedPort(t, p)
			if host != "" {
				require.Equal(t, "127.0.0.1", ip, "%s publishes %q on every interface", name, p)
			}
		}
	}
}

// composeBinary is the settle binary a service runs, from its command.
func composeBinary(svc composeService) string {
	if len(svc.Command) == 0 || !strings.HasPrefix(svc.Command[0], "/usr/local/bin/") {
		return ""
	}
	return path.Base(svc.Command[0])
}

// composeListenPort is the port the service's binary listens on.
func composeListenPort(t *testing.T, cf composeFile, name string) int {
	t.Helper()
	svc := cf.Services[name]
	b, ok := binaries[composeBinary(svc)]
	require.True(t, ok, "service %s runs no settle binary", name)
	addr, set := svc.Environment[b.addrSetting]
	if !set {
		return b.port
	}
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%s %s", name, b.addrSetting)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return p
}

func TestComposeServices(t *testing.T) {
	cf := loadCompose(t)
	root := repoRoot(t)
	for _, name := range composeServices {
		_, ok := cf.Services[name]
		require.True(t, ok, "compose.yaml has no %s service", name)
	}

	image := ""
	for name, svc := range cf.Services {
		if b := composeBinary(svc); b != "" {
			// One image for every settle service, built from the Dockerfile.
			if image == "" {
				image = svc.Image
			}
			require.Equal(t, image, svc.Image, "%s uses another image", name)
			require.NotNil(t, svc.Build, "%s: settle services build the image", name)
			require.True(t, fileExists(root, filepath.Join(svc.Build.Context, orDefault(svc.Build.Dockerfile, "Dockerfile"))), "%s: no Dockerfile in its build context", name)
			require.Contains(t, builtBinaries(t), b, "%s runs %s, which the Dockerfile does not build", name, b)
			require.True(t, svc.ReadOnly, "%s: read_only root filesystem", name)
		}
		// Every long-running service has a healthcheck; the one-shot
		// migrate does not restart.
		if svc.Restart == "no" {
			continue
		}
		require.NotNil(t, svc.Healthcheck, "%s needs a healthcheck", name)
		require.NotEmpty(t, svc.Healthcheck.Test, "%s healthcheck", name)
		require.Contains(t, []string{"CMD", "CMD-SHELL"}, svc.Healthcheck.Test[0], "%s healthcheck", name)
		require.NotEqual(t, "", svc.Restart, "%s: a long-running service restarts", name)
	}
	require.Equal(t, "no", cf.Services["migrate"].Restart, "migrate runs once")
	require.Equal(t, []string{"/usr/local/bin/api", "migrate"}, cf.Services["migrate"].Command)

	require.NotNil(t, cf.Services["worker"].Deploy)
	require.NotNil(t, cf.Services["worker"].Deploy.Replicas)
	require.Equal(t, 3, *cf.Services["worker"].Deploy.Replicas, "three workers by default")
}

// TestComposeHealthchecks checks that the settle services probe their own
// port's /readyz or /healthz with the healthcheck binary of the image
// (distroless has no shell, curl or wget).
func TestComposeHealthchecks(t *testing.T) {
	cf := loadCompose(t)
	for _, name := range []string{"api", "worker", "scheduler"} {
		svc := cf.Services[name]
		test := svc.Healthcheck.Test
		require.Len(t, test, 3, "%s: [CMD, /usr/local/bin/healthcheck, URL]", name)
		require.Equal(t, []string{"CMD", "/usr/local/bin/healthcheck"}, test[:2], name)
		require.Contains(t, builtBinaries(t), "healthcheck")
		port := composeListenPort(t, cf, name)
		require.Regexp(t, fmt.Sprintf(`^http://(127\.0\.0\.1|localhost):%d/(readyz|healthz)$`, port), test[2], "%s probes its own port", name)
	}
	require.Equal(t, "pg_isready", cf.Services["postgres"].Healthcheck.Test[1])
}

func TestComposeDependsOn(t *testing.T) {
	cf := loadCompose(t)
	for name, svc := range cf.Services {
		for dep, d := range svc.DependsOn {
			target, ok := cf.Services[dep]
			require.True(t, ok, "%s depends on unknown service %s", name, dep)
			switch d.Condition {
			case "service_healthy":
				require.NotNil(t, target.Healthcheck, "%s waits for %s to be healthy, but it has no healthcheck", name, dep)
			case "service_completed_successfully":
				require.Equal(t, "no", target.Restart, "%s waits for %s to complete, but it restarts", name, dep)
			default:
				t.Fatalf("%s depends on %s with condition %q; use service_healthy or service_completed_successfully", name, dep, d.Condition)
			}
		}
	}
	for _, name := range []string{"api", "worker", "scheduler"} {
		deps := cf.Services[name].DependsOn
		require.Equal(t, "service_completed_successfully", deps["migrate"].Condition, "%s starts after migrations", name)
		require.Equal(t, "service_healthy", deps["postgres"].Condition, name)
		require.Equal(t, "service_healthy", deps["redis"].Condition, name)
	}
	require.Equal(t, "service_healthy", cf.Services["migrate"].DependsOn["postgres"].Condition)
}

// TestComposeEnvironment checks each settle service's environment against
// the code of the binary it runs.
func TestComposeEnvironment(t *testing.T) {
	cf := loadCompose(t)
	for name, svc := range cf.Services {
		binary := composeBinary(svc)
		if binary == "" {
			continue
		}
		env := map[string]*string{}
		for k, v := range svc.Environment {
			env[k] = &v
		}
		required := requiredSettings(t, binary)
		if len(svc.Command) > 1 && svc.Command[1] == "migrate" {
			required = []string{"DATABASE_URL"}
		}
		checkEnv(t, "compose service "+name, binary, env, required)

		if v, ok := svc.Environment["SHUTDOWN_TIMEOUT"]; ok {
			shutdown, err := time.ParseDuration(v)
			require.NoError(t, err, "%s SHUTDOWN_TIMEOUT", name)
			grace, err := time.ParseDuration(svc.StopGracePeriod)
			require.NoError(t, err, "%s: stop_grace_period must be set above SHUTDOWN_TIMEOUT (compose's default is 10s)", name)
			require.Greater(t, grace, shutdown, "%s: stop_grace_period must exceed SHUTDOWN_TIMEOUT", name)
		}
		if binary == "worker" {
			// Deposits are checked against the chain unless .env says
			// otherwise, and the generated .env names an endpoint.
			require.Equal(t, "finalized", svc.Environment["DEPOSIT_FINALITY"])
			require.NotEmpty(t, strings.TrimSpace(svc.Environment["ETH_RPC_URL"]), "worker with finality on needs ETH_RPC_URL")
		}
		for _, url := range []string{"DATABASE_URL", "REDIS_URL"} {
			if v := svc.Environment[url]; v != "" {
				host := hostOf(t, v)
				_, ok := cf.Services[host]
				require.True(t, ok, "%s: %s points at %s, which is not a compose service", name, url, host)
			}
		}
	}
}

func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	at := strings.LastIndex(rawURL, "@")
	rest := rawURL[strings.Index(rawURL, "://")+3:]
	if at >= 0 {
		rest = rawURL[at+1:]
	}
	host, _, err := net.SplitHostPort(strings.SplitN(rest, "/", 2)[0])
	require.NoError(t, err, rawURL)
	return host
}

func TestComposeRedisDurability(t *testing.T) {
	cmd := strings.Join(loadCompose(t).Services["redis"].Command, " ")
	require.Contains(t, cmd, "--appendonly yes")
	require.Regexp(t, `--appendfsync (everysec|always)`, cmd)
	// Evicting an asynq key would lose a task.
	require.Contains(t, cmd, "--maxmemory-policy noeviction")
}

// TestComposeMountsAndPorts checks that bind mounts exist in the repository,
// named volumes are declared, and published ports do not collide.
func TestComposeMountsAndPorts(t *testing.T) {
	cf := loadCompose(t)
	root := repoRoot(t)
	published := map[string]string{}
	mounted := map[string]bool{}
	for name, svc := range cf.Services {
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			require.GreaterOrEqual(t, len(parts), 2, "%s volume %q", name, v)
			src := parts[0]
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				require.True(t, strings.HasPrefix(src, "./"), "%s mounts %s: bind mounts stay inside the repository", name, src)
				require.True(t, fileExists(root, src), "%s mounts %s, which does not exist", name, src)
				mounted[path.Clean(src)] = true
			} else {
				_, ok := cf.Volumes[src]
				require.True(t, ok, "%s uses volume %s, not declared under volumes:", name, src)
			}
		}
		replicas := 1
		if svc.Deploy != nil && svc.Deploy.Replicas != nil {
			replicas = *svc.Deploy.Replicas
		}
		for _, p := range svc.Ports {
			host, ip := publishedPort(t, p)
			if host == "" {
				continue
			}
			require.Equal(t, 1, replicas, "%s has %d replicas and publishes host port %s: they would collide", name, replicas, host)
			for key, other := range published {
				otherIP, otherPort, _ := strings.Cut(key, "|")
				if otherPort == host && (otherIP == ip || otherIP == "" || ip == "") {
					t.Fatalf("%s and %s both publish host port %s", name, other, host)
				}
			}
			published[ip+"|"+host] = name
		}
	}
	for _, want := range []string{"configs/prometheus", "configs/grafana/provisioning", "configs/grafana/dashboards"} {
		require.True(t, mounted[want], "compose.yaml must mount ./%s", want)
	}
}

// publishedPort reads the short port syntax [ip:]host:container; a bare
// container port publishes nothing fixed.
func publishedPort(t *testing.T, p string) (host, ip string) {
	t.Helper()
	parts := strings.Split(strings.SplitN(p, "/", 2)[0], ":")
	switch len(parts) {
	case 1:
		return "", ""
	case 2:
		host = parts[0]
	case 3:
		ip, host = parts[0], parts[1]
	default:
		t.Fatalf("port %q", p)
	}
	_, err := strconv.Atoi(host)
	require.NoError(t, err, "port %q: host port ranges are not used here", p)
	if ip == "0.0.0.0" {
		ip = ""
	}
	return host, ip
}

// TestComposeConfigTool runs compose's own validation where a compose
// implementation is installed (the Docker plugin or Debian's docker-compose);
// `config` needs no daemon.
func TestComposeConfigTool(t *testing.T) {
	argv := composeTool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Only a generated .env: no shell variable may hide a problem.
	dotEnv := filepath.Join(t.TempDir(), ".env")
	out, err := exec.Command(filepath.Join(harness.Binaries(t), "settlectl"), "env", "--out", dotEnv, "--rpc", "https://rpc.test.invalid/").CombinedOutput()
	require.NoError(t, err, "%s", out)
	args := append(argv[1:], "--env-file", dotEnv, "-f", filepath.Join(repoRoot(t), "compose.yaml"), "config", "-q")
	cmd := exec.CommandContext(ctx, argv[0], args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	cmd.Dir = t.TempDir()
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s config:\n%s", strings.Join(argv, " "), out)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
