package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// runMainEnv makes the test binary act as the api binary, so the serve
// test exercises the real main, signals and exit code included.
const runMainEnv = "SETTLE_TEST_RUN_API_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testenv.Main(m)
}

// waitLimit bounds how long a test waits for the server to come up or go
// down; it is a safety net, not a timing assertion.
const waitLimit = 2 * time.Minute

const (
	testWebhookSecret = "w3bh00k-5ecret-9f8e7d6c5b4a392817060"
	testAdminToken    = "adm1n-t0ken-a1b2c3d4e5f60718293a4b5c"
)

func validSettings() map[string]string {
	return map[string]string{
		"DATABASE_URL":   "postgres://localhost/settle",
		"WEBHOOK_SECRET": testWebhookSecret,
		"API_TOKEN":      "api-t0ken-1f2e3d4c5b6a798807162534",
		"ADMIN_TOKEN":    testAdminToken,
	}
}

func TestSettingsProblemsExitAtOnceNamingTheSetting(t *testing.T) {
	cases := map[string]struct {
		change map[string]string
		drop   string
		want   string
	}{
		"missing database":      {drop: "DATABASE_URL", want: "DATABASE_URL"},
		"bad database url":      {change: map[string]string{"DATABASE_URL": "postgres://settle:" + testWebhookSecret + "@db/settle?sslmode=sometimes"}, want: "setting DATABASE_URL: failed to configure TLS"},
		"missing secret":        {drop: "WEBHOOK_SECRET", want: "WEBHOOK_SECRET"},
		"short secret":          {change: map[string]string{"WEBHOOK_SECRET": strings.Repeat("w", 31)}, want: "WEBHOOK_SECRET"},
		"missing api token":     {drop: "API_TOKEN", want: "API_TOKEN"},
		"short admin token":     {change: map[string]string{"ADMIN_TOKEN": "short"}, want: "ADMIN_TOKEN"},
		"same tokens":           {change: map[string]string{"API_TOKEN": testAdminToken}, want: "API_TOKEN"},
		"placeholder secret":    {change: map[string]string{"WEBHOOK_SECRET": "change-me-webhook-secret-0123456789abcdef"}, want: "WEBHOOK_SECRET"},
		"k8s placeholder":       {change: map[string]string{"ADMIN_TOKEN": "CHANGE-ME-admin-token-at-least-32-characters-long"}, want: "ADMIN_TOKEN"},
		"one-character token":   {change: map[string]string{"API_TOKEN": strings.Repeat("a", 40)}, want: "API_TOKEN"},
		"bad rate limit":        {change: map[string]string{"WEBHOOK_RATE_LIMIT": "30 per second"}, want: "WEBHOOK_RATE_LIMIT"},
		"bad trusted proxies":   {change: map[string]string{"TRUSTED_PROXIES": "10.0.0.0/99"}, want: "TRUSTED_PROXIES"},
		"empty signing key":     {change: map[string]string{"ALCHEMY_SIGNING_KEY": "whsec_a,,whsec_b"}, want: "ALCHEMY_SIGNING_KEY"},
		"empty quicknode token": {change: map[string]string{"QUICKNODE_SECURITY_TOKEN": "qn_a,,qn_b"}, want: "QUICKNODE_SECURITY_TOKEN"},
		"empty moralis secret":  {change: map[string]string{"MORALIS_STREAM_SECRET": " , "}, want: "MORALIS_STREAM_SECRET"},
		"bad webhook max age":   {change: map[string]string{"WEBHOOK_MAX_AGE": "0s"}, want: "WEBHOOK_MAX_AGE"},
		"bad listen address":    {change: map[string]string{"HTTP_ADDR": "8080"}, want: "HTTP_ADDR"},
		"bad redis url":         {change: map[string]string{"REDIS_URL": "http://localhost"}, want: "REDIS_URL"},
		"bad shutdown timeout":  {change: map[string]string{"SHUTDOWN_TIMEOUT": "soon"}, want: "SHUTDOWN_TIMEOUT"},
		"bad log level":         {change: map[string]string{"LOG_LEVEL": "chatty"}, want: "LOG_LEVEL"},
		"bad finality policy":   {change: map[string]string{"DEPOSIT_FINALITY": "eventually"}, want: "DEPOSIT_FINALITY"},
		"bad rpc url":           {change: map[string]string{"ETH_RPC_URL": "ftp://node.example"}, want: "ETH_RPC_URL"},
		"bad rpc timeout":       {change: map[string]string{"ETH_RPC_TIMEOUT": "-1s"}, want: "ETH_RPC_TIMEOUT"},
		"rpc response max low":  {change: map[string]string{"RPC_RESPONSE_MAX": "65536"}, want: "RPC_RESPONSE_MAX"},
		"rpc response max unit": {change: map[string]string{"RPC_RESPONSE_MAX": "128MiB"}, want: "RPC_RESPONSE_MAX"},

		"bad verified rate limit":     {change: map[string]string{"WEBHOOK_VERIFIED_RATE_LIMIT": "fast"}, want: "WEBHOOK_VERIFIED_RATE_LIMIT"},
		"unverified budget too small": {change: map[string]string{"INGEST_UNVERIFIED_BYTES_MAX": "6291456"}, want: "INGEST_UNVERIFIED_BYTES_MAX"},
		"client share over budget":    {change: map[string]string{"INGEST_UNVERIFIED_BYTES_MAX": "8388608", "INGEST_UNVERIFIED_CLIENT_BYTES_MAX": "16777216"}, want: "INGEST_UNVERIFIED_CLIENT_BYTES_MAX"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			env := validSettings()
			delete(env, tc.drop)
			for k, v := range tc.change {
				env[k] = v
			}
			var out bytes.Buffer
			require.Equal(t, exitFailure, run(nil, config.FromMap(env), &out))
			require.Equal(t, 1, strings.Count(out.String(), "\n"), "one line: %q", out.String())
			require.Contains(t, out.String(), tc.want)
			for _, secret := range []string{strings.Repeat("w", 31), testAdminToken, testWebhookSecret, "change-me-webhook", "CHANGE-ME-admin", strings.Repeat("a", 40)} {
				require.NotContains(t, out.String(), secret, "secrets are never printed")
			}
		})
	}
}

func TestUsage(t *testing.T) {
	var out bytes.Buffer
	require.Equal(t, exitUsage, run([]string{"serve", "now"}, config.FromMap(validSettings()), &out))
	require.Contains(t, out.String(), "usage")
}

// `api migrate` needs only DATABASE_URL, migrates an empty database, and
// a second run is a no-op.
func TestMigrateIsIdempotent(t *testing.T) {
	pg := testenv.Postgres(t)
	if pg == nil {
		t.Skip("needs the harness's own PostgreSQL to create an empty database")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	name := fmt.Sprintf("settle_api_migrate_%d", os.Getpid())
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	env := map[string]string{"DATABASE_URL": pg.URL(name)}
	for range 2 {
		var out bytes.Buffer
		require.Equal(t, 0, run([]string{"migrate"}, config.FromMap(env), &out), out.String())
	}
	db, err := postgres.Open(ctx, pg.URL(name), postgres.Options{ConnsMax: 1})
	require.NoError(t, err)
	defer db.Close()
	current, err := db.SchemaCurrent(ctx)
	require.NoError(t, err)
	require.True(t, current)
}

// MIGRATE_TIMEOUT bounds `api migrate`: a bad value stops it naming the
// setting, and a migration past it fails saying so.
func TestMigrateTimeout(t *testing.T) {
	var out bytes.Buffer
	env := map[string]string{"DATABASE_URL": testenv.EmptyDatabaseURL(t), "MIGRATE_TIMEOUT": "soon"}
	require.Equal(t, exitFailure, run([]string{"migrate"}, config.FromMap(env), &out))
	require.Contains(t, out.String(), "MIGRATE_TIMEOUT")

	out.Reset()
	env["MIGRATE_TIMEOUT"] = "1ms"
	require.Equal(t, exitFailure, run([]string{"migrate"}, config.FromMap(env), &out))
	require.Contains(t, out.String(), "MIGRATE_TIMEOUT")

	out.Reset()
	env["MIGRATE_TIMEOUT"] = "5m"
	require.Equal(t, 0, run([]string{"migrate"}, config.FromMap(env), &out), out.String())
}

// The real binary serves, and on SIGTERM stops cleanly with exit 0.
func TestServeAndStopOnSIGTERM(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	settings := validSettings()
	settings["DATABASE_URL"] = testenv.DatabaseURL(t)
	settings["REDIS_URL"] = testenv.RedisURL(t)
	settings["HTTP_ADDR"] = addr
	settings[runMainEnv] = "1"

	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(settings)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(waitLimit)
	for {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				require.NotEmpty(t, resp.Header.Get("X-Request-ID"))
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("api exited early (%v): %s", err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("api never became ready: %s", stderr.String())
		}
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0 expected: %s", stderr.String())
	case <-time.After(waitLimit):
		t.Fatalf("api did not stop: %s", stderr.String())
	}
	require.Contains(t, stderr.String(), "api stopped cleanly")
}

// An api told to stop while it still waits for PostgreSQL at start (a
// rolling deploy during a database failover) has nothing in flight: exit 0,
// as for any SIGTERM.
func TestSIGTERMWhileWaitingForPostgresExitsZero(t *testing.T) {
	// Accepts and never answers: the process waits to connect.
	silent := testenv.NewSilentServer(t)
	httpPort, err := devenv.FreePort()
	require.NoError(t, err)
	settings := validSettings()
	settings["DATABASE_URL"] = fmt.Sprintf("postgres://settle@127.0.0.1:%d/settle?connect_timeout=1", silent.Port)
	settings["REDIS_URL"] = "redis://127.0.0.1:1/0"
	settings["HTTP_ADDR"] = fmt.Sprintf("127.0.0.1:%d", httpPort)
	settings[runMainEnv] = "1"

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
		t.Fatalf("api did not stop within 20s: %s", stderr.String())
	}
}

// A request still running when SHUTDOWN_TIMEOUT runs out is cut off and
// the api exits 0: any stranger can hold one by sending a webhook's body
// slowly (the read deadline is 30s), and nothing it sent was accepted, so
// cutting it loses nothing.
func TestSIGTERMWithASlowClientExitsZero(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	settings := validSettings()
	settings["DATABASE_URL"] = testenv.DatabaseURL(t)
	settings["REDIS_URL"] = testenv.RedisURL(t)
	settings["HTTP_ADDR"] = addr
	settings["SHUTDOWN_TIMEOUT"] = "2s"
	settings[runMainEnv] = "1"

	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(settings)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	deadline := time.Now().Add(waitLimit)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("api exited early (%v): %s", err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "api never became ready: %s", stderr.String())
	}

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /webhook/payments HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Signature: 00\r\nContent-Length: 1000\r\n\r\n{\"event_id\":", addr)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the handler now waits for the body

	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit 0 expected after %s; stderr: %s", time.Since(start).Round(time.Millisecond), lastLine(stderr.String()))
		// SHUTDOWN_TIMEOUT is 2 s and the exit takes ~3 s (3.1 s under
		// load); waiting for the slow request would take its 30 s read
		// deadline.
		require.Less(t, time.Since(start), 15*time.Second, "SHUTDOWN_TIMEOUT is 2s")
		require.Contains(t, stderr.String(), "were cut off")
		require.Contains(t, stderr.String(), "api stopped cleanly")
	case <-time.After(20 * time.Second):
		t.Fatalf("api did not stop within 20s: %s", stderr.String())
	}
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

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// PROVIDER_BODY_MAX raises every provider route's limit; the unverified
// budget, unset, grows to hold two such bodies, and set below that is
// refused rather than leaving the route unable to take one.
func TestProviderBodyMax(t *testing.T) {
	read := func(change map[string]string) (settings, error) {
		m := validSettings()
		maps.Copy(m, change)
		env := config.FromMap(m)
		s := readCommon(env)
		readServe(env, &s)
		return s, env.Err()
	}
	s, err := read(nil)
	require.NoError(t, err)
	require.Equal(t, httpapi.ProviderBodyMaxDefault, s.providerBodyMax)
	require.Equal(t, httpapi.UnverifiedBytesMaxDefault, s.unverifiedBytesMax)

	s, err = read(map[string]string{"PROVIDER_BODY_MAX": "67108864"})
	require.NoError(t, err)
	require.Equal(t, 64<<20, s.providerBodyMax)
	require.Equal(t, 128<<20, s.unverifiedBytesMax, "the unset budget holds two bodies")
	require.Equal(t, 128<<20, s.unverifiedClientBytesMax, "so does the unset share of a client")

	s, err = read(map[string]string{"PROVIDER_BODY_MAX": "1048576", "INGEST_UNVERIFIED_BYTES_MAX": "2097152", "INGEST_UNVERIFIED_CLIENT_BYTES_MAX": "1048576"})
	require.NoError(t, err, "the floors")
	require.Equal(t, 1<<20, s.providerBodyMax)

	for name, change := range map[string]map[string]string{
		"below the floor":      {"PROVIDER_BODY_MAX": "1048575"},
		"above the ceiling":    {"PROVIDER_BODY_MAX": "268435457"},
		"a unit":               {"PROVIDER_BODY_MAX": "16MiB"},
		"budget under two":     {"PROVIDER_BODY_MAX": "33554432", "INGEST_UNVERIFIED_BYTES_MAX": "50331648"},
		"default under budget": {"INGEST_UNVERIFIED_BYTES_MAX": "6291456"},
	} {
		_, err := read(change)
		require.Error(t, err, name)
		want := "PROVIDER_BODY_MAX"
		if _, ok := change["INGEST_UNVERIFIED_BYTES_MAX"]; ok {
			want = "INGEST_UNVERIFIED_BYTES_MAX"
		}
		require.Contains(t, err.Error(), want, name)
	}
}
