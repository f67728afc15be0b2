package test

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// TestSignalWhileWaitingForPostgreSQLIsACleanStop: a worker or scheduler
// told to stop while it still waits for PostgreSQL at start exits 0 (a
// rolling deploy stops pods that never became ready; that is no failure).
func TestSignalWhileWaitingForPostgreSQLIsACleanStop(t *testing.T) {
	// A server that accepts connections and never answers: PostgreSQL
	// still starting, or a pooler waiting for it.
	silent := testenv.NewSilentServer(t)
	port := silent.Port
	for _, bin := range []string{"worker", "scheduler"} {
		t.Run(bin, func(t *testing.T) {
			metrics, err := devenv.FreePort()
			require.NoError(t, err)
			cmd := exec.Command(filepath.Join(harness.Binaries(t), bin))
			cmd.Env = []string{
				// Nobody answers there: the process waits to connect.
				fmt.Sprintf("DATABASE_URL=postgres://postgres@127.0.0.1:%d/settle?sslmode=disable", port),
				"REDIS_URL=redis://127.0.0.1:1/0",
				fmt.Sprintf("METRICS_ADDR=127.0.0.1:%d", metrics),
				"DEPOSIT_FINALITY=none",
			}
			// Read only after Wait: the command's copier writes it until then.
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			before := silent.Connected()
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Signalled only once it waits for PostgreSQL: a SIGTERM before
			// its signal handlers are set kills it, which is not what is
			// tested.
			silent.AwaitConnection(t, before, done, out.String)
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("%s did not stop on SIGTERM (then killed: %v):\n%s", bin, <-done, out.String())
			}
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				t.Fatalf("%s exited %d on SIGTERM while waiting for PostgreSQL:\n%s", bin, exit.ExitCode(), out.String())
			}
			require.NoError(t, err)
			require.Contains(t, out.String(), "stopped by a signal before it was ready")
		})
	}
}
