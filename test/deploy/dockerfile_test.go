package deploy

import (
	"bufio"
	"encoding/json"
	"go/build"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	image, name string
	body        []instruction
}

// parseDockerfile reads instructions (continuation lines joined, comments
// dropped) and splits them into stages, expanding global ARG defaults in
// FROM lines.
func parseDockerfile(t *testing.T) (stages []stage, globalArgs map[string]string) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "Dockerfile"))
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	require.NoError(t, sc.Err())
	require.Zero(t, cur.Len(), "the Dockerfile ends inside a continued line")

	globalArgs = map[string]string{}
	for _, line := range lines {
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		switch {
		case in.cmd == "ARG" && len(stages) == 0:
			k, v, _ := strings.Cut(in.args, "=")
			globalArgs[k] = v
		case in.cmd == "FROM":
			fields := strings.Fields(os.Expand(in.args, func(k string) string { return globalArgs[k] }))
			s := stage{image: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
		default:
			require.NotEmpty(t, stages, "%s before the first FROM", in.cmd)
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		}
	}
	return stages, globalArgs
}

var goDirective = regexp.MustCompile(`(?m)^go ([0-9][0-9.]*)\s*$`)

// versionLess compares dotted Go versions numerically (1.26 < 1.26.8).
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		x, y := 0, 0
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

var goBuildPackages = regexp.MustCompile(`(?:^|\s)(\./[A-Za-z0-9_./-]+)`)

// builtPackages are the package directories the Dockerfile's go build names.
func builtPackages(t *testing.T) []string {
	t.Helper()
	stages, _ := parseDockerfile(t)
	for _, in := range stages[0].body {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			_, after, _ := strings.Cut(in.args, "go build")
			var pkgs []string
			for _, m := range goBuildPackages.FindAllStringSubmatch(after, -1) {
				pkgs = append(pkgs, path.Clean(m[1]))
			}
			return pkgs
		}
	}
	t.Fatal("the build stage runs no go build")
	return nil
}

// builtBinaries are the names the binaries get in /usr/local/bin.
func builtBinaries(t *testing.T) []string {
	var names []string
	for _, p := range builtPackages(t) {
		names = append(names, path.Base(p))
	}
	return names
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	stages, args := parseDockerfile(t)
	require.GreaterOrEqual(t, len(stages), 2, "multi-stage: build, then a small final image")
	for _, s := range stages {
		if s.image == "scratch" {
			continue
		}
		_, tag, hasTag := strings.Cut(s.image[strings.LastIndex(s.image, "/")+1:], ":")
		require.True(t, hasTag || strings.Contains(s.image, "@sha256:"), "FROM %s: pin a tag", s.image)
		require.NotEqual(t, "latest", tag, "FROM %s: pin a version, not latest", s.image)
	}

	// The Go image must be at least go.mod's go version: GOTOOLCHAIN=local
	// forbids downloading a newer toolchain at build time.
	builder := stages[0]
	require.True(t, strings.HasPrefix(builder.image, "golang:"), "the build stage is golang, got %s", builder.image)
	goVersion := strings.TrimPrefix(builder.image, "golang:")
	goVersion, _, _ = strings.Cut(goVersion, "-")
	raw, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := goDirective.FindSubmatch(raw)
	require.NotNil(t, m, "go.mod has no go line")
	require.False(t, versionLess(goVersion, string(m[1])),
		"golang:%s is older than go.mod's go %s (ARG GO_VERSION=%s)", goVersion, m[1], args["GO_VERSION"])

	// Layer order: modules, then sources, then the build.
	var order []string
	env := map[string]string{}
	for _, in := range builder.body {
		switch {
		case in.cmd == "ENV":
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		case in.cmd == "COPY" && in.args == "go.mod go.sum ./":
			order = append(order, "copy-mod")
		case in.cmd == "RUN" && strings.Contains(in.args, "go mod download"):
			order = append(order, "download")
		case in.cmd == "COPY" && in.args == ". .":
			order = append(order, "copy-src")
		case in.cmd == "RUN" && strings.Contains(in.args, "go build"):
			order = append(order, "build")
			require.Contains(t, in.args, "-o /out/")
		}
	}
	require.Equal(t, []string{"copy-mod", "download", "copy-src", "build"}, order, "the module download layer comes before the sources")
	require.Equal(t, "0", env["CGO_ENABLED"], "static binaries need CGO_ENABLED=0")
	require.Equal(t, "local", env["GOTOOLCHAIN"])

	pkgs := builtPackages(t)
	for _, want := range []string{"cmd/api", "cmd/worker", "cmd/scheduler", "cmd/settlectl", "deploy/healthcheck"} {
		require.Contains(t, pkgs, want, "the image must carry %s", want)
	}
	for _, p := range pkgs {
		pkg, err := build.Default.ImportDir(filepath.Join(root, filepath.FromSlash(p)), 0)
		require.NoError(t, err, p)
		require.Equal(t, "main", pkg.Name, "%s is not a command", p)
	}

	final := stages[len(stages)-1]
	var user, command string
	copied := false
	for _, in := range final.body {
		switch in.cmd {
		case "USER":
			user = in.args
		case "CMD", "ENTRYPOINT":
			var argv []string
			require.NoError(t, json.Unmarshal([]byte(in.args), &argv), "%s in exec form", in.cmd)
			command = argv[0]
		case "COPY":
			copied = copied || in.args == "--from="+builder.name+" /out/ /usr/local/bin/"
		}
	}
	require.True(t, copied, "the final stage copies the binaries to /usr/local/bin/")
	uid, _, _ := strings.Cut(user, ":")
	n, err := strconv.Atoi(uid)
	require.NoError(t, err, "USER must be numeric (Kubernetes' runAsNonRoot cannot check a name), got %q", user)
	require.NotZero(t, n, "USER must not be root")
	require.Contains(t, builtBinaries(t), path.Base(command), "the default command runs a built binary")
	require.Equal(t, "/usr/local/bin/", path.Dir(command)+"/")
}

// TestDockerignore checks that the build context keeps every file the
// build needs (go.mod, go.sum, the Go files and embedded files of every
// package the binaries import) and leaves out .git and .env.
func TestDockerignore(t *testing.T) {
	root := repoRoot(t)
	ignore := loadDockerignore(t, root)
	require.True(t, ignore.excluded(".git"), ".git stays out of the build context")
	require.True(t, ignore.excluded(".env"), ".env (secrets) stays out of the build context")

	needed := []string{"go.mod", "go.sum"}
	for _, p := range builtPackages(t) {
		for dir, pkg := range localPackages(t, root, filepath.FromSlash(p)) {
			for _, f := range pkg.GoFiles {
				needed = append(needed, filepath.ToSlash(filepath.Join(dir, f)))
			}
			for _, pattern := range pkg.EmbedPatterns {
				matches, err := filepath.Glob(filepath.Join(root, dir, filepath.FromSlash(pattern)))
				require.NoError(t, err)
				require.NotEmpty(t, matches, "%s embeds %s, which matches nothing", dir, pattern)
				for _, m := range matches {
					rel, err := filepath.Rel(root, m)
					require.NoError(t, err)
					needed = append(needed, filepath.ToSlash(rel))
				}
			}
		}
	}
	for _, f := range needed {
		require.False(t, ignore.excluded(f), ".dockerignore excludes %s, which the build needs", f)
	}
}

type dockerignore []struct {
	re     *regexp.Regexp
	negate bool
}

func loadDockerignore(t *testing.T, root string) dockerignore {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	var out dockerignore
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		negate := strings.HasPrefix(line, "!")
		line = strings.TrimPrefix(line, "!")
		line = strings.Trim(path.Clean(line), "/")
		out = append(out, struct {
			re     *regexp.Regexp
			negate bool
		}{globRegexp(line), negate})
	}
	return out
}

// globRegexp turns a .dockerignore pattern into a regexp: * and ? stay in
// one path element, ** spans any number of them.
func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; {
		case strings.HasPrefix(pattern[i:], "**/"):
			b.WriteString("(?:.*/)?")
			i += 2
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// excluded applies the patterns in order (the last match wins) to the path
// and each of its parent directories, as Docker does.
func (d dockerignore) excluded(rel string) bool {
	parts := strings.Split(rel, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		out := false
		for _, p := range d {
			if p.re.MatchString(prefix) {
				out = !p.negate
			}
		}
		if out {
			return true
		}
	}
	return false
}
