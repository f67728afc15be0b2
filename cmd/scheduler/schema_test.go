package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
)

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWaitsForMigrationsBeforeRunning: the real scheduler on an empty
// database enqueues, scans and runs nothing (it ran on with warnings),
// saying to run `api migrate`; once migrated it starts and its jobs run;
// SIGTERM then exits 0.
func TestWaitsForMigrationsBeforeRunning(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	metricsPort, err := devenv.FreePort()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(map[string]string{
		"DATABASE_URL": dsn,
		"REDIS_URL":    testenv.RedisURL(t),
		"METRICS_ADDR": fmt.Sprintf("127.0.0.1:%d", metricsPort),
		runMainEnv:     "1",
	})
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			select {
			case err := <-exited:
				t.Fatalf("scheduler exited (%v) waiting for %s: %s", err, what, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %s", what, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	time.Sleep(3 * time.Second) // past a poll of the schema
	require.NotContains(t, stderr.String(), "scheduler started")
	require.NotContains(t, stderr.String(), "does not exist", "nothing ran against the missing tables")
	// The scheduler's first look at the schema says it; a slow start may
	// take longer than the sleep.
	waitFor("the migrate hint", func() bool { return strings.Contains(stderr.String(), "run `api migrate`") })

	db := testenv.OpenDB(t, dsn)
	_, err = db.Migrate(ctx)
	require.NoError(t, err)
	waitFor("the start", func() bool { return strings.Contains(stderr.String(), "scheduler started") })
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	waitFor("a periodic job", func() bool {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM scheduler_jobs`).Scan(&n))
		return n > 0
	})

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "stderr: %s", stderr.String())
	case <-time.After(40 * time.Second):
		t.Fatalf("scheduler did not stop within 40s: %s", stderr.String())
	}
}
