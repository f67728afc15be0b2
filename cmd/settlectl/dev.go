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

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("dev", "run the whole system locally (PostgreSQL, Redis, a simulated chain per network, api, worker, scheduler)", runDev)
}

// Fixed local ports by default, so the printed addresses stay the same
// across runs; flags move them (the dev stack test runs on free ports).
const (
	devPostgresPort = 55432
	devRedisPort    = 56379
	// devChainPort is the first network's chain; each next one the next port.
	devChainPort = 58545
	// devMetricsPort is the worker's; the scheduler's is the next port.
	devMetricsPort  = 9091
	devDatabase     = "settle"
	devStartTimeout = 60 * time.Second
	devStopTimeout  = 30 * time.Second
	// devTokenAsset is the ERC-20 each dev chain deploys on every start,
	// listed with that network's decimals (devNetworks).
	devTokenAsset = "DUSD"
	// devNetworksMax bounds --networks: each network is a node in this
	// process and a client, breaker and cache in every service.
	devNetworksMax = 4
)

// devNetwork is a simulated chain `settlectl dev` runs as a network
// settle knows (its chain id comes from the networks table).
type devNetwork struct {
	name string
	// tokenDecimals of the dev token there: 6 on one network and 18 on
	// the other show that an asset's precision is per network.
	tokenDecimals int
}

// devNetworks are the networks `settlectl dev` can simulate.
var devNetworks = []devNetwork{
	{name: "ETH_MAINNET", tokenDecimals: 6},
	{name: "BASE_MAINNET", tokenDecimals: 18},
}

// devChainState is one running dev chain in state.json.
type devChainState struct {
	Network       string `json:"network"`
	ChainID       int64  `json:"chain_id"`
	URL           string `json:"url"`
	Token         string `json:"token"`
	TokenDecimals int    `json:"token_decimals"`
}

// devState is what `settlectl demo` needs to find the running stack.
type devState struct {
	APIURL        string          `json:"api_url"`
	DatabaseURL   string          `json:"database_url,omitempty"`
	Chains        []devChainState `json:"chains,omitempty"`
	TokenAsset    string          `json:"token_asset,omitempty"`
	WebhookSecret string          `json:"webhook_secret"`
	AlchemyKey    string          `json:"alchemy_signing_key"`
	AdminToken    string          `json:"admin_token"`
	APIToken      string          `json:"api_token"`
}

func runDev(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dir := fs.String("dir", ".dev", "where data, logs and binaries live")
	policy := fs.String("finality", "finalized", "DEPOSIT_FINALITY of the worker (every network)")
	apiAddr := fs.String("api", "127.0.0.1:8080", "api listen address")
	networks := fs.String("networks", "ETH_MAINNET,BASE_MAINNET", "the networks to simulate, one chain each (NETWORKS)")
	pgPort := fs.Int("postgres-port", devPostgresPort, "PostgreSQL port")
	redisPort := fs.Int("redis-port", devRedisPort, "Redis port")
	chainPort := fs.Int("chain-port", devChainPort, "the first network's JSON-RPC port; each next network the next port")
	metricsPort := fs.Int("metrics-port", devMetricsPort, "the worker's metrics port; the scheduler's the next")
	blockInterval := fs.Duration("block-interval", devchain.BlockIntervalDefault, "time between blocks on every chain")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	nets, err := pickDevNetworks(*networks)
	if err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	// Checked before the build and the servers: a bad policy would
	// otherwise surface a minute later as the worker's exit.
	if _, err := chain.ParsePolicy(*policy); err != nil {
		return fmt.Errorf("%w: --finality: %w", config.ErrUsage, err)
	}
	for _, p := range []struct {
		flag string
		port int
	}{{"--postgres-port", *pgPort}, {"--redis-port", *redisPort}, {"--chain-port", *chainPort}, {"--metrics-port", *metricsPort}} {
		// The chain and metrics ports are the first of a few in a row.
		if p.port < 1 || p.port > 65535-devNetworksMax {
			return fmt.Errorf("%w: %s %d is not a port (1..%d)", config.ErrUsage, p.flag, p.port, 65535-devNetworksMax)
		}
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
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: postgresDir(root), Port: *pgPort})
	if errors.Is(err, devenv.ErrPortTaken) {
		return fmt.Errorf("%w (stop it, or pick another with --postgres-port)", err)
	}
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pg.Stop()
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{Dir: filepath.Join(root, "redis"), Port: *redisPort, Durable: true, Hz: devenv.RedisHzDeployed})
	if errors.Is(err, devenv.ErrPortTaken) {
		return fmt.Errorf("%w (stop it, or pick another with --redis-port)", err)
	}
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer rds.Stop()
	dsn, err := prepareDatabase(ctx, pg)
	if err != nil {
		return err
	}

	chains, err := startDevChains(ctx, out, dsn, postgresDir(root), nets, *chainPort, *blockInterval)
	for _, c := range chains {
		defer c.chain.Close()
	}
	if err != nil {
		return err
	}

	names := make([]string, 0, len(chains))
	for _, c := range chains {
		names = append(names, c.state.Network)
	}
	env := map[string]string{
		"DATABASE_URL":         dsn,
		"REDIS_URL":            rds.URL(0),
		"WEBHOOK_SECRET":       secrets.WebhookSecret,
		"ALCHEMY_SIGNING_KEY":  secrets.AlchemyKey,
		"ADMIN_TOKEN":          secrets.AdminToken,
		"API_TOKEN":            secrets.APIToken,
		"NETWORKS":             strings.Join(names, ","),
		"DEPOSIT_FINALITY":     *policy,
		"FINALITY_RECHECK_MAX": "5s",
		"WEBHOOK_RATE_LIMIT":   "off",
		"LOG_LEVEL":            "info",
		// Whatever the shell says: its alias must agree with this run's chain.
		"ETH_RPC_URL": "",
	}
	for _, c := range chains {
		env[finality.RPCSetting(c.state.Network)] = c.state.URL
		if c.state.Network == payment.DefaultNetwork {
			env["ETH_RPC_URL"] = c.state.URL
		}
	}
	workerMetrics := fmt.Sprintf("127.0.0.1:%d", *metricsPort)
	schedulerMetrics := fmt.Sprintf("127.0.0.1:%d", *metricsPort+1)
	procs := []*devProc{
		{name: "api", env: map[string]string{"HTTP_ADDR": *apiAddr}},
		{name: "worker", env: map[string]string{"METRICS_ADDR": workerMetrics}},
		{name: "scheduler", env: map[string]string{"METRICS_ADDR": schedulerMetrics}},
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
		APIURL: "http://" + *apiAddr, DatabaseURL: dsn, TokenAsset: devTokenAsset,
		WebhookSecret: secrets.WebhookSecret, AlchemyKey: secrets.AlchemyKey, AdminToken: secrets.AdminToken, APIToken: secrets.APIToken,
	}
	var chainLines strings.Builder
	for _, c := range chains {
		state.Chains = append(state.Chains, c.state)
		fmt.Fprintf(&chainLines, "  %-19s %s   (chain id %d; %s token at %s, %d decimals)\n",
			c.state.Network, c.state.URL, c.state.ChainID, devTokenAsset, c.state.Token, c.state.TokenDecimals)
	}
	if err := writeJSONFile(filepath.Join(root, "state.json"), state); err != nil {
		return err
	}
	fmt.Fprintf(out, `
settle is running. Ctrl-C stops everything.

  api                 %s   (OpenAPI: %s/openapi.yaml)
  asynqmon dashboard  %s/admin/queues/   (user: anything, password: the admin token)
  worker metrics      http://%s/metrics
  scheduler metrics   http://%s/metrics
  PostgreSQL          %s
  Redis               %s
  NETWORKS            %s   (one simulated chain each; finalized lags the head)
%s
  ADMIN_TOKEN         %s
  API_TOKEN           %s
  WEBHOOK_SECRET      %s
  ALCHEMY_SIGNING_KEY %s

  logs                %s/*.log
  try                 go tool task demo
`, state.APIURL, state.APIURL, state.APIURL, workerMetrics, schedulerMetrics, dsn, rds.URL(0), env["NETWORKS"], chainLines.String(),
		secrets.AdminToken, secrets.APIToken, secrets.WebhookSecret, secrets.AlchemyKey, filepath.Join(root, "logs"))

	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\nstopping ...")
		return nil
	case p := <-exited:
		return fmt.Errorf("%s exited unexpectedly; its log ends with:\n%s", p.name, tailFile(p.logPath, 20))
	}
}

// pickDevNetworks reads --networks: names of devNetworks, each once.
func pickDevNetworks(list string) ([]devNetwork, error) {
	var out []devNetwork
	seen := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		found := false
		for _, n := range devNetworks {
			if n.name == name {
				out = append(out, n)
				found = true
			}
		}
		if !found {
			known := make([]string, 0, len(devNetworks))
			for _, n := range devNetworks {
				known = append(known, n.name)
			}
			return nil, fmt.Errorf("--networks: settlectl dev simulates %s, not %q", strings.Join(known, " and "), name)
		}
	}
	if len(out) == 0 || len(out) > devNetworksMax {
		return nil, fmt.Errorf("--networks: name between 1 and %d networks", devNetworksMax)
	}
	return out, nil
}

// devChain is a running simulated chain and what state.json says of it.
type devChain struct {
	chain *devchain.Chain
	state devChainState
}

// startDevChains starts one simulated chain per network, answering the
// network's chain id (so the worker's eth_chainId check passes), deploys
// the dev token on each and lists it there with that network's decimals.
// The chains it started are returned even on an error, to be closed.
func startDevChains(ctx context.Context, out io.Writer, dsn, pgDir string, nets []devNetwork, firstPort int, interval time.Duration) ([]devChain, error) {
	db, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 2})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	registry, err := db.Assets(ctx)
	if err != nil {
		return nil, fmt.Errorf("read networks: %w", err)
	}
	var chains []devChain
	for i, n := range nets {
		network, ok := registry.Network(n.name)
		if !ok || network.ChainID == 0 {
			return chains, fmt.Errorf("network %s has no chain id in the networks table", n.name)
		}
		fmt.Fprintf(out, "starting the simulated chain of %s (chain id %d) ...\n", n.name, network.ChainID)
		chain, err := devchain.Serve(ctx, devchain.Options{Port: firstPort + i, ChainID: network.ChainID, BlockInterval: interval})
		if err != nil {
			return chains, fmt.Errorf("dev chain of %s: %w", n.name, err)
		}
		chains = append(chains, devChain{chain: chain})
		token, _, err := chain.DeployToken(ctx, 0)
		if err != nil {
			return chains, fmt.Errorf("deploy the dev token on %s: %w", n.name, err)
		}
		listing := payment.Asset{Code: devTokenAsset, Network: n.name, Contract: strings.ToLower(token), Decimals: n.tokenDecimals}
		if _, err := db.AddAsset(ctx, listing); err != nil {
			// The token's address is the same on every run (account 0's
			// first transaction), so only a hand-edited dev database
			// conflicts.
			return chains, fmt.Errorf("list %s on %s (remove %s to start afresh): %w", devTokenAsset, n.name, pgDir, err)
		}
		chains[i].state = devChainState{Network: n.name, ChainID: network.ChainID, URL: chain.URL(), Token: strings.ToLower(token), TokenDecimals: n.tokenDecimals}
	}
	return chains, nil
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

// devProc is one service run by `settlectl dev`.
type devProc struct {
	name    string
	env     map[string]string
	proc    devenv.Process
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
	if err := p.proc.Start(cmd); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := p.proc.Done()
	go func() {
		<-done
		log.Close()
		exited <- p
	}()
	return nil
}

// stopAll asks every service to stop and waits for them.
func stopAll(procs []*devProc) {
	for _, p := range procs {
		if p.proc.Running() {
			_ = p.proc.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(devStopTimeout)
	for _, p := range procs {
		if !p.proc.Running() {
			continue
		}
		select {
		case <-p.proc.Done():
		case <-time.After(time.Until(deadline)):
			p.proc.Kill()
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
