package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDockerfileStampsBuildInfo: the image's binaries say which build
// they are. The build stage takes VERSION and REVISION as build args and
// links them into pkg/buildinfo's variables, which must exist under those
// names (a rename would make -X a silent no-op); compose passes both.
func TestDockerfileStampsBuildInfo(t *testing.T) {
	root := repoRoot(t)
	stages, _ := parseDockerfile(t)
	args := map[string]bool{}
	build := ""
	for _, in := range stages[0].body {
		switch {
		case in.cmd == "ARG":
			name, _, _ := strings.Cut(in.args, "=")
			args[name] = true
		case in.cmd == "RUN" && strings.Contains(in.args, "go build"):
			build = in.args
		}
	}
	require.NotEmpty(t, build)
	src, err := os.ReadFile(filepath.Join(root, "pkg", "buildinfo", "buildinfo.go"))
	require.NoError(t, err)
	for variable, arg := range map[string]string{"version": "VERSION", "revision": "REVISION"} {
		require.True(t, args[arg], "the build stage declares no ARG %s", arg)
		require.Contains(t, build, "-X "+modulePath+"/pkg/buildinfo."+variable+"=${"+arg+"}", "go build does not stamp %s", variable)
		require.Regexp(t, regexp.MustCompile(`(?m)^\s+`+variable+`\s+string$`), string(src), "pkg/buildinfo has no string variable %s", variable)
	}

	x := loadCompose(t).Extensions["x-settle"].(map[string]any)
	buildArgs := x["build"].(map[string]any)["args"].(map[string]any)
	require.Contains(t, buildArgs, "VERSION")
	require.Contains(t, buildArgs, "REVISION")
}
