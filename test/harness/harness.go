// Package harness runs settle's real binaries for end-to-end and chaos
// tests: it builds api, worker, scheduler and settlectl once, starts them
// as separate processes against a test's PostgreSQL and Redis, and lets
// the test stop, kill and restart them.
package harness

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
)

// Fixed test secrets (each at least 32 characters).
const (
	WebhookSecret = "test-webhook-secret-0123456789abcdef"
	AdminToken    = "test-admin-token-0123456789abcdefghij"
	APIToken      = "test-api-token-0123456789abcdefghijkl"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries builds the commands, once per test process, into the
// checkout's bin/test (bin/test-race with -race) and returns that
// directory.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		// One directory per checkout and kind, shared by every test
		// package: go build leaves a binary whose build ID is already
		// the one it would link, so only the first package of a run
		// links the four (~50 CPU-s with -race) and the rest find them
		// up to date. A stale one is replaced by rename, which a running
		// copy survives.
		kind, args := "test", []string{"build"}
		if RaceBinaries() {
			kind, args = "test-race", append(args, "-race")
		}
		binDir = filepath.Join(root, "bin", kind)
		if err = os.MkdirAll(binDir, 0o755); err != nil {
			buildErr = err
			return
		}
		args = append(args, "-o", binDir+"/")
		cmd := exec.Command("go", append(args, "./cmd/api", "./cmd/worker", "./cmd/scheduler", "./cmd/settlectl")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	return binDir
}

// RaceBinaries reports whether the binaries are built with -race:
// SETTLE_RACE_BINARIES=1 (the Taskfile's test task sets it) or =0 decides;
// unset, CI=true does.
func RaceBinaries() bool {
	switch os.Getenv(raceBinariesVar) {
	case "1", "true":
		return true
	case "0", "false":
		return false
	}
	return os.Getenv("CI") == "true"
}

const (
	raceBinariesVar = "SETTLE_RACE_BINARIES"
	// raceWarning opens every race detector report.
	raceWarning = "WARNING: DATA RACE"
	// raceOptions keep a racing process running after its first report
	// (the test sees all of them at the end) and make its exit code say so.
	raceOptions = "halt_on_error=0 exitcode=66"
)

// checkRaces fails t for every process whose output holds a race report.
// It reads everything a process wrote over all its runs, so a run ended
// by SIGKILL keeps the reports it printed before.
func checkRaces(t testing.TB, procs []*Proc) {
	t.Helper()
	for _, p := range procs {
		if report, ok := raceReport(p.Logs()); ok {
			t.Errorf("%s: the race detector reported a data race:\n%s", p.Name, report)
		}
	}
}

// raceReport is the first race report in out, if any.
func raceReport(out string) (string, bool) {
	i := strings.Index(out, raceWarning)
	if i < 0 {
		return "", false
	}
	report := out[i:]
	if end := strings.Index(report, "=================="); end >= 0 {
		report = report[:end]
	}
	return tailLines(report, raceReportLinesMax), true
}

// raceReportLinesMax bounds the report quoted in a failure.
const raceReportLinesMax = 60

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Proc is one running binary.
type Proc struct {
	Name string
	Bin  string
	Args []string
	Env  map[string]string
	// Port is the HTTP port (api) or metrics port (worker, scheduler).
	Port int

	t    testing.TB
	proc devenv.Process
	logs *lockedBuffer
}

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

// Start runs the process (again).
func (p *Proc) Start() {
	p.t.Helper()
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = testenv.Env(p.Env)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := p.proc.Start(cmd); err != nil {
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool { return p.proc.Running() }

// Stop sends SIGTERM and waits up to grace, then kills.
func (p *Proc) Stop(grace time.Duration) (exitCode int) { return p.proc.Stop(syscall.SIGTERM, grace) }

// Kill ends the process with SIGKILL, mid-whatever.
func (p *Proc) Kill() { p.proc.Kill() }

// Pid is the process id (0 if not started).
func (p *Proc) Pid() int { return p.proc.Pid() }

// Logs is everything the process wrote so far.
func (p *Proc) Logs() string { return p.logs.String() }

// URL is the process's HTTP base URL.
func (p *Proc) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", p.Port) }

// WaitReady polls /readyz until it answers 200.
func (p *Proc) WaitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !p.Running() {
			p.t.Fatalf("%s exited during start:\n%s", p.Name, tailLines(p.Logs(), 30))
		}
		resp, err := http.Get(p.URL() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("%s not ready after %s:\n%s", p.Name, timeout, tailLines(p.Logs(), 30))
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stack is a running settle installation for one test.
type Stack struct {
	T           testing.TB
	DatabaseURL string
	RedisURL    string
	// Env is given to every process; tests may add to it before starting
	// processes.
	Env   map[string]string
	Procs []*Proc
	DB    *pgx.Conn
}

// NewStack prepares a fresh database and Redis database; it starts no
// process yet.
func NewStack(t testing.TB) *Stack {
	t.Helper()
	s := newStack(t)
	s.DatabaseURL, s.RedisURL = testenv.DatabaseURL(t), testenv.RedisURL(t)
	s.Env = map[string]string{
		"DATABASE_URL":          s.DatabaseURL,
		"REDIS_URL":             s.RedisURL,
		"WEBHOOK_SECRET":        WebhookSecret,
		"ADMIN_TOKEN":           AdminToken,
		"API_TOKEN":             APIToken,
		"WEBHOOK_RATE_LIMIT":    "off",
		"DEPOSIT_FINALITY":      "none",
		"LOG_LEVEL":             "info",
		"SHUTDOWN_TIMEOUT":      "10s",
		"POLL_INTERVAL":         "500ms",
		"WORKER_POLL_INTERVAL":  "10ms",
		"RETRY_BASE_DELAY":      "50ms",
		"RETRY_MAX_DELAY":       "500ms",
		"STALE_ENQUEUED_AFTER":  "3m",
		"RECOVER_INTERVAL":      "2m",
		"MAX_RECOVERY_ATTEMPTS": "10",
	}
	conn, err := pgx.Connect(context.Background(), s.DatabaseURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	s.DB = conn
	t.Cleanup(func() { conn.Close(context.Background()) })
	return s
}

// newStack is a Stack without a database: its cleanup stops every process
// still running, then fails t for any race report in any process's output.
func newStack(t testing.TB) *Stack {
	s := &Stack{T: t, Env: map[string]string{}}
	t.Cleanup(func() {
		for _, p := range s.Procs {
			if p.Running() {
				p.Stop(15 * time.Second)
			}
		}
		checkRaces(t, s.Procs)
		if t.Failed() {
			for _, p := range s.Procs {
				t.Logf("---- %s logs (tail) ----\n%s", p.Name, tailLines(p.Logs(), 40))
			}
		}
	})
	return s
}

func (s *Stack) newProc(name, bin string, portVar string, extra map[string]string, args ...string) *Proc {
	s.T.Helper()
	port, err := devenv.FreePort()
	if err != nil {
		s.T.Fatal(err)
	}
	env := map[string]string{"GORACE": raceOptions}
	for k, v := range s.Env {
		env[k] = v
	}
	env[portVar] = fmt.Sprintf("127.0.0.1:%d", port)
	for k, v := range extra {
		env[k] = v
	}
	path := bin
	if !filepath.IsAbs(bin) {
		path = filepath.Join(Binaries(s.T), bin)
	}
	p := &Proc{Name: name, Bin: path, Args: args, Env: env, Port: port, t: s.T, logs: &lockedBuffer{}}
	s.Procs = append(s.Procs, p)
	return p
}

// StartAPI starts an api process and waits until it is ready.
func (s *Stack) StartAPI(extra map[string]string) *Proc {
	s.T.Helper()
	p := s.newProc(fmt.Sprintf("api-%d", len(s.Procs)), "api", "HTTP_ADDR", extra)
	p.Start()
	p.WaitReady(30 * time.Second)
	return p
}

// StartWorker starts a worker process and waits until it is ready.
func (s *Stack) StartWorker(extra map[string]string) *Proc {
	s.T.Helper()
	p := s.newProc(fmt.Sprintf("worker-%d", len(s.Procs)), "worker", "METRICS_ADDR", extra)
	p.Start()
	p.WaitReady(30 * time.Second)
	return p
}

// Spawn starts a binary ("api", "worker", "scheduler") without waiting
// for /readyz: for processes whose dependencies are down on purpose. It
// waits for /healthz, which only says the process is serving.
func (s *Stack) Spawn(bin string, extra map[string]string) *Proc {
	s.T.Helper()
	portVar := "METRICS_ADDR"
	if bin == "api" {
		portVar = "HTTP_ADDR"
	}
	p := s.newProc(fmt.Sprintf("%s-%d", bin, len(s.Procs)), bin, portVar, extra)
	p.Start()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.URL() + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if !p.Running() {
			s.T.Fatalf("%s exited during start:\n%s", p.Name, tailLines(p.Logs(), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.T.Fatalf("%s not serving /healthz:\n%s", p.Name, tailLines(p.Logs(), 30))
	return nil
}

// StartScheduler starts a scheduler process and waits until it is ready.
func (s *Stack) StartScheduler(extra map[string]string) *Proc {
	s.T.Helper()
	p := s.newProc(fmt.Sprintf("scheduler-%d", len(s.Procs)), "scheduler", "METRICS_ADDR", extra)
	p.Start()
	p.WaitReady(30 * time.Second)
	return p
}

// Settlectl runs the CLI to completion and returns its output and exit code.
func (s *Stack) Settlectl(args ...string) (string, int) {
	s.T.Helper()
	cmd := exec.Command(filepath.Join(Binaries(s.T), "settlectl"), args...)
	env := map[string]string{"GORACE": raceOptions}
	for k, v := range s.Env {
		env[k] = v
	}
	cmd.Env = testenv.Env(env)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			s.T.Fatalf("settlectl: %v", err)
		}
		code = exitErr.ExitCode()
	}
	if report, ok := raceReport(string(out)); ok {
		s.T.Errorf("settlectl %s: the race detector reported a data race:\n%s", strings.Join(args[:min(len(args), 1)], " "), report)
	}
	return string(out), code
}

// Sign is the X-Signature of body.
func Sign(body []byte, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// Client talks to an api process.
type Client struct {
	Base string
	HTTP *http.Client
}

// NewClient is a client with bounded timeouts.
func NewClient(base string) *Client {
	return &Client{Base: base, HTTP: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
}

// Webhook posts a signed /webhook/payments body and returns the status
// and decoded response.
func (c *Client) Webhook(body []byte) (int, map[string]any, error) {
	req, err := http.NewRequest(http.MethodPost, c.Base+"/webhook/payments", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Signature", Sign(body, WebhookSecret))
	return c.do(req)
}

// Admin sends an admin request.
func (c *Client) Admin(method, path string, body any) (int, map[string]any, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.Base+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	req.Header.Set("Content-Type", "application/json")
	return c.do(req)
}

func (c *Client) do(req *http.Request) (int, map[string]any, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	out := map[string]any{}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out, nil
}

// Payment builds a /webhook/payments body.
func Payment(eventID, eventType string, userID int64, asset, amount string) []byte {
	b, _ := json.Marshal(map[string]any{"event_id": eventID, "event_type": eventType, "user_id": userID, "asset": asset, "amount": amount})
	return b
}

// Count runs a COUNT query on the stack's database.
func (s *Stack) Count(query string, args ...any) int {
	s.T.Helper()
	var n int
	if err := s.DB.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		s.T.Fatalf("%s: %v", query, err)
	}
	return n
}

// WaitFor polls cond until it holds or timeout passes.
func (s *Stack) WaitFor(what string, timeout time.Duration, cond func() bool) {
	s.T.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			s.T.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AllTerminal reports whether every event is confirmed or failed.
func (s *Stack) AllTerminal() bool {
	return s.Count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed','failed')`) == 0
}

// Read sends an authenticated GET to a /v1 route.
func (c *Client) Read(path string) (int, map[string]any, error) {
	req, err := http.NewRequest(http.MethodGet, c.Base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+APIToken)
	return c.do(req)
}
