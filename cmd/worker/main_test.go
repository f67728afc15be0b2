package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

// runMainEnv makes the test binary act as the worker binary, so a test
// exercises the real main, signals and exit code included.
const runMainEnv = "SETTLE_TEST_RUN_WORKER_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testenv.Main(m)
}

// lockedBuffer is written by the child's output copier while the test
// reads it.
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

// A worker told to stop while it still waits for PostgreSQL at start has
// nothing in flight: exit 0, as for any SIGTERM (service.Main), which
// needs postgres.Open's error to say it was canceled.
func TestSIGTERMWhileWaitingForPostgresExitsZero(t *testing.T) {
	// Accepts and never answers: the process waits to connect.
	silent := testenv.NewSilentServer(t)
	metricsPort, err := devenv.FreePort()
	require.NoError(t, err)
	settings := map[string]string{
		"DATABASE_URL":     fmt.Sprintf("postgres://settle@127.0.0.1:%d/settle?connect_timeout=1", silent.Port),
		"REDIS_URL":        "redis://127.0.0.1:1/0",
		"DEPOSIT_FINALITY": "none",
		"METRICS_ADDR":     fmt.Sprintf("127.0.0.1:%d", metricsPort),
		runMainEnv:         "1",
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(settings)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// Signalled once it waits for PostgreSQL, not after a guessed sleep:
	// a SIGTERM before its signal handlers are set kills it.
	silent.AwaitConnection(t, 0, exited, stderr.String)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "SIGTERM must exit 0; stderr: %s", strings.TrimSpace(stderr.String()))
		require.Contains(t, stderr.String(), "stopped by a signal before it was ready")
	case <-time.After(20 * time.Second):
		t.Fatalf("worker did not stop within 20s: %s", stderr.String())
	}
}

// TestRPCTimeoutPastTheProbeTTLStarts: the RPC runbook says to raise
// ETH_RPC_TIMEOUT on timeouts; a value past the breaker's default 10s
// probe slot passes the settings and then the start too (the slot follows
// the timeout), rather than failing after PostgreSQL naming another
// setting.
func TestRPCTimeoutPastTheProbeTTLStarts(t *testing.T) {
	for _, timeout := range []string{"9s", "10s", "15s", "1m"} {
		env := config.FromMap(map[string]string{
			"DATABASE_URL":    "postgres://settle@db/settle",
			"ETH_RPC_URL":     "https://rpc.example",
			"ETH_RPC_TIMEOUT": timeout,
		})
		s := readSettings(env)
		require.NoError(t, env.Err(), "ETH_RPC_TIMEOUT=%s", timeout)
		clients, err := finality.Dial(context.Background(), s.Chain, finality.Deps{Log: zerolog.Nop()})
		require.NoError(t, err, "ETH_RPC_TIMEOUT=%s", timeout)
		clients.Close()
	}
}

// TestRetryDelaysAreChecked: a retry base above its ceiling, or a ceiling
// past a day, is refused at start naming the setting.
func TestRetryDelaysAreChecked(t *testing.T) {
	for _, c := range []struct{ base, ceiling, bad string }{
		{"2m", "60s", "RETRY_BASE_DELAY"},
		{"1s", "48h", "RETRY_MAX_DELAY"},
		{"", "500ms", "RETRY_BASE_DELAY"},
	} {
		m := map[string]string{"DATABASE_URL": "postgres://settle@db/settle", "DEPOSIT_FINALITY": "none", "RETRY_MAX_DELAY": c.ceiling}
		if c.base != "" {
			m["RETRY_BASE_DELAY"] = c.base
		}
		env := config.FromMap(m)
		readSettings(env)
		require.ErrorContains(t, env.Err(), c.bad, "%+v", c)
	}
	env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@db/settle", "DEPOSIT_FINALITY": "none",
		"RETRY_BASE_DELAY": "5s", "RETRY_MAX_DELAY": "5s"})
	readSettings(env)
	require.NoError(t, env.Err())
}

// TestContentionWindowIsChecked: RETRY_CONTENTION_WINDOW defaults to five
// minutes and is refused past an hour or at zero, naming the setting.
func TestContentionWindowIsChecked(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://settle@db/settle", "DEPOSIT_FINALITY": "none"}
	env := config.FromMap(base)
	require.Equal(t, 5*time.Minute, readSettings(env).ContentionWindow)
	require.NoError(t, env.Err())
	for _, bad := range []string{"2h", "0s", "soon"} {
		m := map[string]string{"RETRY_CONTENTION_WINDOW": bad}
		for k, v := range base {
			m[k] = v
		}
		env := config.FromMap(m)
		readSettings(env)
		require.ErrorContains(t, env.Err(), "RETRY_CONTENTION_WINDOW", bad)
	}
	m := map[string]string{"RETRY_CONTENTION_WINDOW": "1h"}
	for k, v := range base {
		m[k] = v
	}
	env = config.FromMap(m)
	require.Equal(t, time.Hour, readSettings(env).ContentionWindow)
	require.NoError(t, env.Err())
}

// TestWaitsForMigrationsBeforeTakingTasks: the real worker started on a
// database one migration behind (its migrate Job still running, or one
// that failed) takes no task, says to run `api migrate`, and answers its
// probes (/readyz "pending"); once migrated it settles the waiting event.
func TestWaitsForMigrationsBeforeTakingTasks(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyDatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.MigrateTo(ctx, postgres.LatestSchemaVersion()-1)
	require.NoError(t, err)
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{
		ID: "early-deposit", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3"), TraceID: "t-early",
	}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	redisURL := testenv.RedisURL(t)
	rdb, err := redisconn.Open(redisURL)
	require.NoError(t, err)
	defer rdb.Close()
	queued, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	_, err = asynq.NewClientFromRedisClient(rdb).Enqueue(queued, opts...)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	status := func() string {
		var s string
		require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM payment_events WHERE event_id = 'early-deposit'`).Scan(&s))
		return s
	}

	metricsPort, err := devenv.FreePort()
	require.NoError(t, err)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", metricsPort)
	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(map[string]string{
		"DATABASE_URL":     dsn,
		"REDIS_URL":        redisURL,
		"DEPOSIT_FINALITY": "none",
		"METRICS_ADDR":     metricsAddr,
		runMainEnv:         "1",
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
				t.Fatalf("worker exited (%v) waiting for %s: %s", err, what, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %s", what, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	var readyz string
	waitFor("/readyz", func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		readyz = fmt.Sprintf("%d %s", resp.StatusCode, body)
		return true
	})
	time.Sleep(3 * time.Second) // past a poll of the schema
	require.Equal(t, "enqueued", status(), "the event settled before the schema was current")
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "no task taken before the schema is current")
	require.Contains(t, stderr.String(), "run `api migrate`")
	require.NotContains(t, stderr.String(), "worker started")
	require.True(t, strings.HasPrefix(readyz, "503 "), readyz)
	require.Contains(t, readyz, `"migrations":"pending"`)

	_, err = db.Migrate(ctx)
	require.NoError(t, err)
	waitFor("the deposit confirmed", func() bool { return status() == "confirmed" })
	// Logged after asynq's processors start, which may confirm it first.
	waitFor("the start", func() bool { return strings.Contains(stderr.String(), "worker started") })

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "stderr: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("worker did not stop within 30s: %s", stderr.String())
	}
}

// TestSIGTERMWhileWaitingForMigrationsExitsZero: on an empty database the
// worker waits for `api migrate` (it exited on the missing networks
// table), and a SIGTERM meanwhile is a clean stop.
func TestSIGTERMWhileWaitingForMigrationsExitsZero(t *testing.T) {
	metricsPort, err := devenv.FreePort()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(map[string]string{
		"DATABASE_URL":     testenv.EmptyDatabaseURL(t),
		"REDIS_URL":        testenv.RedisURL(t),
		"DEPOSIT_FINALITY": "none",
		"METRICS_ADDR":     fmt.Sprintf("127.0.0.1:%d", metricsPort),
		runMainEnv:         "1",
	})
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "run `api migrate`") {
		select {
		case err := <-exited:
			t.Fatalf("worker exited (%v) instead of waiting for migrations: %s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no word of `api migrate` within 20s: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "SIGTERM must exit 0; stderr: %s", strings.TrimSpace(stderr.String()))
		require.Contains(t, stderr.String(), "stopped by a signal before it was ready")
	case <-time.After(20 * time.Second):
		t.Fatalf("worker did not stop within 20s: %s", stderr.String())
	}
}
