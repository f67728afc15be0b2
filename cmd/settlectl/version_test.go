package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestVersionStamped builds settlectl the way the Dockerfile does and
// checks that `settlectl version` prints what -ldflags stamped.
func TestVersionStamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds settlectl")
	}
	bin := filepath.Join(t.TempDir(), "settlectl")
	const pkg = "github.com/settle/settle/pkg/buildinfo"
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X "+pkg+".version=9.8.7 -X "+pkg+".revision=cafe1234", ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	out, err = exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "version 9.8.7\nrevision cafe1234\n", string(out))
}

func TestVersionArgs(t *testing.T) {
	var out bytes.Buffer
	require.ErrorIs(t, runVersion(context.Background(), []string{"extra"}, &out), config.ErrUsage)
	require.NoError(t, runVersion(context.Background(), nil, &out))
	require.Regexp(t, `^version \S+\nrevision \S+\n$`, out.String())
}
