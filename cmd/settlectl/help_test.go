package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGroupHelp: `settlectl dlq --help` (a command made of subcommands)
// is help, not an unknown subcommand "--help": usage on stdout, exit 0;
// `settlectl` alone is a usage error, its usage on stderr.
func TestGroupHelp(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "settlectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	}
	for _, args := range [][]string{{"users", "--help"}, {"addresses", "-h"}, {"dlq", "--help"}, {"holds", "help"},
		{"notifications", "--help"}, {"networks", "--help"}, {"assets", "-h"}, {"events", "--help"}, {"version", "--help"}} {
		stdout, stderr, code := run(args...)
		name := strings.Join(args, " ")
		assert.Equal(t, 0, code, "settlectl %s: %s", name, stderr)
		assert.Contains(t, stdout, "usage: settlectl "+args[0], "settlectl %s", name)
		assert.Empty(t, stderr, "settlectl %s", name)
	}
	stdout, stderr, code := run()
	assert.Equal(t, 2, code)
	assert.Empty(t, stdout, "a usage error prints on stdout")
	assert.Contains(t, stderr, "usage: settlectl <command>")
}
