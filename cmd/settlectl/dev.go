//go:build dev

package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("dev", "run the whole system locally (PostgreSQL, Redis, a simulated chain, api, worker, scheduler)", runDev)
}

// Fixed local ports, so the printed addresses stay the same across runs.
const (
	devPostgresPort = 55432
	devRedisPort    = 56379
	devChainPort    = 58545
	devDatabase     = "settle"
	devStartTimeout = 60 * time.Second
	devStopTimeout  = 30 * time.Second
	// DevTokenAsset is the ERC-20 the dev chain deploys on every start.
	devTokenAsset    = "TUSD"
	devTokenDecimals = 6
)

// devState is what `settlectl demo` needs to find the running stack.
type devState struct {
	APIURL        string `json:"api_url"`
	ChainURL      string `json:"chain_url"`
	Token         string `json:"token"`
	WebhookSecret string `json:"webhook_secret"`
	AlchemyKey    string `json:"alchemy_signing_key"`
	AdminToken    string `json:"admin_token"`
	APIToken      string `json:"api_token"`
	Network       string `json:"network"`
}

func runDev(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dir := fs.String("dir", ".dev", "where data, logs and binaries live")
	finality := fs.String("finality", "finalized", "DEPOSIT_FINALITY of the worker")
	apiAddr := fs.String("api", "127.0.0.1:8080", "api listen address")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := ensureInstalled(out); err != nil {
		return err
	}
	root, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	for _, sub := range []string{"logs", "bin"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			return err
		}
	}
	secrets, err := devSecrets(filepath.Join(root, "secrets.json"))
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "building api, worker, scheduler ...")
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(root, "bin")+"/", "./cmd/api", "./cmd/worker", "./cmd/scheduler")
	build.Stdout, build.Stderr = out, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build (run this from the repository root): %w", err)
	}

	fmt.Fprintln(out, "starting PostgreSQL and Redis ...")
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: postgresDir(root), Port: devPostgresPort})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pg.Stop()
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{Dir: filepath.Join(root, "redis"), Port: devRedisPort, Durable: true})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer rds.Stop()
	dsn, err := prepareDatabase(ctx, pg)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "starting the simulated chain ...")
	chain, err := devchain.Serve(ctx, devchain.Options{Port: devChainPort})
	if err != nil {
		return fmt.Errorf("dev chain: %w", err)
	}
	defer chain.Close()
	token, _, err := chain.DeployToken(ctx, 0)
	if err != nil {
		return fmt.Errorf("deploy dev token: %w", err)
	}
	if err := registerDevToken(ctx, dsn, token); err != nil {
		return err
	}

	env := map[string]string{
		"DATABASE_URL":         dsn,
		"REDIS_URL":            rds.URL(0),
		"WEBHOOK_SECRET":       secrets.WebhookSecret,
		"ALCHEMY_SIGNING_KEY":  secrets.AlchemyKey,
		"ADMIN_TOKEN":          secrets.AdminToken,
		"API_TOKEN":            secrets.APIToken,
		"ETH_RPC_URL":          chain.URL(),
		"DEPOSIT_FINALITY":     *finality,
		"FINALITY_RECHECK_MAX": "5s",
		"WEBHOOK_RATE_LIMIT":   "off",
		"LOG_LEVEL":            "info",
	}
	procs := []*devProc{
		{name: "api", env: map[string]string{"HTTP_ADDR": *apiAddr}},
		{name: "worker", env: map[string]string{"METRICS_ADDR": "127.0.0.1:9091"}},
		{name: "scheduler", env: map[string]string{"METRICS_ADDR": "127.0.0.1:9092"}},
	}
	exited := make(chan *devProc, len(procs))
	for _, p := range procs {
		if err := p.start(root, env, exited); err != nil {
			stopAll(procs)
			return err
		}
	}
	defer stopAll(procs)
	if err := waitReady(ctx, "http://"+*apiAddr+"/readyz"); err != nil {
		return fmt.Errorf("api: %w (see %s)", err, filepath.Join(root, "logs", "api.log"))
	}

	state := devState{
		APIURL: "http://" + *apiAddr, ChainURL: chain.URL(), Token: token, Network: "ETH_MAINNET",
		WebhookSecret: secrets.WebhookSecret, AlchemyKey: secrets.AlchemyKey, AdminToken: secrets.AdminToken, APIToken: secrets.APIToken,
	}
	if err := writeJSONFile(filepath.Join(root, "state.json"), state); err != nil {
		return err
	}
	fmt.Fprintf(out, `
settle is running. Ctrl-C stops everything.

  api                 %s   (OpenAPI: %s/openapi.yaml)
  asynqmon dashboard  %s/admin/queues/   (user: anything, password: the admin token)
  worker metrics      http://127.0.0.1:9091/metrics
  scheduler metrics   http://127.0.0.1:9092/metrics
  PostgreSQL          %s
  Redis               %s
  simulated chain     %s   (finalized lags the head; %s token at %s)

  ADMIN_TOKEN         %s
  API_TOKEN           %s
  WEBHOOK_SECRET      %s
  ALCHEMY_SIGNING_KEY %s

  logs                %s/*.log
  try                 go tool task demo
`, state.APIURL, state.APIURL, state.APIURL, dsn, rds.URL(0), chain.URL(), devTokenAsset, token,
		secrets.AdminToken, secrets.APIToken, secrets.WebhookSecret, secrets.AlchemyKey, filepath.Join(root, "logs"))

	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\nstopping ...")
		return nil
	case p := <-exited:
		return fmt.Errorf("%s exited unexpectedly; its log ends with:\n%s", p.name, tailFile(p.logPath, 20))
	}
}

// postgresDir is where the dev cluster lives. As root the server runs as
// the postgres account, which may not be able to reach a checkout under
// /root; the cluster then lives under /var/tmp, keyed by the checkout.
func postgresDir(root string) string {
	if os.Geteuid() != 0 {
		return filepath.Join(root, "postgres")
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join("/var/tmp", "settle-dev-"+hex.EncodeToString(sum[:6]), "postgres")
}

// ensureInstalled installs PostgreSQL and Redis from the distribution's
// packages when they are missing and we run as root.
func ensureInstalled(out io.Writer) error {
	_, pgErr := devenv.PostgresBinDir()
	_, redisErr := devenv.RedisServerPath()
	var missing []string
	if pgErr != nil {
		missing = append(missing, "postgresql")
	}
	if redisErr != nil {
		missing = append(missing, "redis-server")
	}
	if len(missing) == 0 {
		return nil
	}
	install := "apt-get update && apt-get install -y " + strings.Join(missing, " ")
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		return fmt.Errorf("missing %s: install it first (as root: %s)", strings.Join(missing, " and "), install)
	}
	fmt.Fprintln(out, "installing", strings.Join(missing, " "), "from the distribution's packages ...")
	cmd := exec.Command("sh", "-c", install)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	return cmd.Run()
}

func devSecrets(path string) (devState, error) {
	var s devState
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &s); err == nil && s.WebhookSecret != "" {
			return s, nil
		}
	}
	s = devState{WebhookSecret: randomSecret(), AlchemyKey: "whsec_" + randomSecret(), AdminToken: randomSecret(), APIToken: randomSecret()}
	return s, writeJSONFile(path, s)
}

func randomSecret() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b)
}

func writeJSONFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// prepareDatabase creates the settle database if needed and migrates it.
func prepareDatabase(ctx context.Context, pg *devenv.Postgres) (string, error) {
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, devDatabase).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+devDatabase); err != nil {
			return "", err
		}
	}
	dsn := pg.URL(devDatabase)
	db, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 2})
	if err != nil {
		return "", err
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	return dsn, nil
}

// registerDevToken points the TUSD asset at this run's token contract (the
// simulated chain starts empty every time).
func registerDevToken(ctx context.Context, dsn, contract string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ($1, 'ETH_MAINNET', $2, $3)
		ON CONFLICT (code) DO UPDATE SET contract_address = EXCLUDED.contract_address`, devTokenAsset, strings.ToLower(contract), devTokenDecimals)
	return err
}

// devProc is one service run by `settlectl dev`.
type devProc struct {
	name    string
	env     map[string]string
	cmd     *exec.Cmd
	logPath string
}

func (p *devProc) start(root string, env map[string]string, exited chan<- *devProc) error {
	p.logPath = filepath.Join(root, "logs", p.name+".log")
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(root, "bin", p.name))
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range p.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd = cmd
	go func() {
		_ = cmd.Wait()
		log.Close()
		exited <- p
	}()
	return nil
}

// stopAll asks every service to stop and waits for them.
func stopAll(procs []*devProc) {
	for _, p := range procs {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(devStopTimeout)
	for _, p := range procs {
		for p.cmd != nil && p.cmd.ProcessState == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p.cmd != nil && p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
		}
	}
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(devStartTimeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("not ready in time")
}

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1<<20)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
