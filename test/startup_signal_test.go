package test

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/test/harness"
)

// TestSignalWhileWaitingForPostgreSQLIsACleanStop: a worker or scheduler
// told to stop while it still waits for PostgreSQL at start exits 0 (a
// rolling deploy stops pods that never became ready; that is no failure).
func TestSignalWhileWaitingForPostgreSQLIsACleanStop(t *testing.T) {
	// A server that accepts connections and never answers: PostgreSQL
	// still starting, or a pooler waiting for it.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	var accepted atomic.Int64
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			accepted.Add(1)
		}
	}()
	port := silent.Addr().(*net.TCPAddr).Port
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
			before := accepted.Load()
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			// Signalled only once it waits for PostgreSQL (its connection
			// reached the silent server): a race binary on a loaded machine
			// can take seconds to get there, and a SIGTERM before its signal
			// handlers are set kills it, which is not what is tested.
			waiting := time.NewTicker(20 * time.Millisecond)
			defer waiting.Stop()
			deadline := time.After(time.Minute)
			for accepted.Load() == before {
				select {
				case err = <-done:
					t.Fatalf("%s exited before the signal (%v):\n%s", bin, err, out.String())
				case <-deadline:
					_ = cmd.Process.Kill()
					t.Fatalf("%s never connected to the database address (then killed: %v):\n%s", bin, <-done, out.String())
				case <-waiting.C:
				}
			}
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
