//go:build dev

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/loadgen"
)

func init() {
	register("load", "send signed webhooks at a rate or flat out, wait for settlement, report throughput, latency, invariants and (--pids, --proc-match) CPU per event and idle CPU", runLoad)
}

func runLoad(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	api := fs.String("api", "http://127.0.0.1:8080", "api base URL")
	events := fs.Int("events", 10_000, "events to send")
	rate := fs.Float64("rate", 0, "events per second (0: as fast as possible)")
	concurrency := fs.Int("concurrency", 64, "requests in flight")
	users := fs.Int("users", 100, "distinct users")
	userBase := fs.Int64("user-base", 1, "first user id")
	assets := fs.String("assets", "ETH,USDC,USDT,WBTC,DAI", "assets, comma-separated")
	initial := fs.String("initial-balance", "1000", "initial balance of every user in every asset (for withdrawals)")
	withdrawals := fs.Int("withdrawals", 20, "percent of events that are withdrawals")
	holds := fs.Int("holds", 5, "percent of events that are withdrawal holds, each then posted (3 in 4) or voided")
	duplicates := fs.Int("duplicates", 20, "percent of events delivered again later")
	concurrentDups := fs.Int("concurrent-duplicates", 5, "percent of events delivered twice at once")
	conflicts := fs.Int("conflicts", 2, "percent of events redelivered with another amount (409)")
	invalid := fs.Int("invalid", 2, "percent of requests that are invalid (401/400)")
	wait := fs.Duration("wait", 10*time.Minute, "how long to wait for settlement")
	jsonPath := fs.String("json", "", "also write the result as JSON to this file (- for stdout)")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()), "random seed of the request mix")
	quiet := fs.Bool("quiet", false, "no progress bar")
	pids := fs.String("pids", "", "measure the CPU of these processes, name=pid,... (each with its children: give PostgreSQL's postmaster)")
	procMatch := fs.String("proc-match", "", "measure the CPU of the processes with these command names, e.g. api,worker,scheduler,postgres,redis-server (one each)")
	idle := fs.Duration("idle", 0, "first measure the processes' CPU over this long with nothing sent (e.g. 60s); with --events 0, only that")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := loadgen.Config{
		APIURL: strings.TrimRight(*api, "/"),
		Events: *events, Rate: *rate, Concurrency: *concurrency, Users: *users, UserIDBase: *userBase,
		Assets: strings.Split(*assets, ","), InitialBalance: *initial, WaitTimeout: *wait, Seed: *seed,
		Mix: loadgen.Mix{Withdrawals: *withdrawals, Holds: *holds, Duplicates: *duplicates, ConcurrentDups: *concurrentDups, Conflicts: *conflicts, Invalid: *invalid},
	}
	// Every value is checked before anything is measured, seeded or sent:
	// a bad one is a usage error (exit 2), as for every other command,
	// not loadgen's refusal after the connections (exit 1).
	if err := checkLoadFlags(cfg); err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	procs, err := loadProcs(*pids, *procMatch)
	if err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	if (*idle > 0 || *events == 0) && len(procs) == 0 {
		return fmt.Errorf("%w: --idle and --events 0 measure CPU: name the processes with --pids or --proc-match", config.ErrUsage)
	}
	if *idle < 0 || *idle > idleWindowMax {
		return fmt.Errorf("%w: --idle must be 0..%s", config.ErrUsage, idleWindowMax)
	}
	if *idle > 0 {
		use, err := loadgen.MeasureIdle(ctx, procs, *idle)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "idle CPU over %.1fs (%% of one core):\n%s", use.WindowSeconds, use.Text())
		if *events == 0 {
			if *jsonPath != "" {
				return writeLoadJSON(out, *jsonPath, use)
			}
			return nil
		}
	}
	env := config.FromOS()
	secret := env.Required("WEBHOOK_SECRET")
	admin := env.Required("ADMIN_TOKEN")
	if err := env.Err(); err != nil {
		return fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.WebhookSecret, cfg.AdminToken, cfg.DB, cfg.Procs = secret, admin, db, procs
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(out, formatResult(res, *seed))
	if *jsonPath != "" {
		if err := writeLoadJSON(out, *jsonPath, res); err != nil {
			return err
		}
	}
	if !res.InvariantsOK || res.Unexpected > 0 {
		return errCheckFailed
	}
	return nil
}

// checkLoadFlags checks what load's flags gave, naming the flag; --events
// 0 sends nothing (only --idle's measure), so the rest is not read then.
func checkLoadFlags(cfg loadgen.Config) error {
	if u, err := url.Parse(cfg.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("--api must be an http:// or https:// URL")
	}
	switch {
	case cfg.Events == 0:
		return nil
	case cfg.UserIDBase < 1:
		return errors.New("--user-base must be a positive user id")
	case cfg.WaitTimeout <= 0:
		return errors.New("--wait must be above zero")
	}
	return cfg.CheckValues() // its words name the flag: "events must be 1..10000000"
}

// idleWindowMax bounds --idle.
const idleWindowMax = time.Hour

// loadProcs is the processes named by --pids and found by --proc-match.
func loadProcs(pids, match string) ([]loadgen.Proc, error) {
	procs, err := loadgen.ParsePids(pids)
	if err != nil {
		return nil, fmt.Errorf("--pids: %w", err)
	}
	if match != "" {
		found, err := loadgen.MatchProcs(strings.Split(match, ","))
		if err != nil {
			return nil, fmt.Errorf("--proc-match: %w", err)
		}
		procs = append(procs, found...)
	}
	if len(procs) > loadgen.ProcsMax {
		return nil, fmt.Errorf("at most %d processes", loadgen.ProcsMax)
	}
	// A process that cannot be read is refused now, not after the seeding.
	if _, err := loadgen.SampleCPU(procs); err != nil {
		return nil, err
	}
	return procs, nil
}

func writeLoadJSON(out io.Writer, path string, v any) error {
	if path == "-" {
		return writeJSON(out, v)
	}
	return writeJSONFile(path, v)
}

func formatResult(r loadgen.Result, seed uint64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s (seed %d): %d events, %d requests in %.2fs\n", r.RunID, seed, r.Events, r.Requests, r.IngestSeconds)
	keys := make([]string, 0, len(r.Answers))
	for k := range r.Answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  answered %-16s %d\n", k, r.Answers[k])
	}
	fmt.Fprintf(&b, "  unexpected answers   %d\n", r.Unexpected)
	fmt.Fprintf(&b, "accepted/s  %.1f   (webhook round trip p50 %.1f ms, p99 %.1f ms)\n", r.AcceptedPerSec, r.RequestMillis["p50"], r.RequestMillis["p99"])
	fmt.Fprintf(&b, "applied/s   %.1f   (%d terminal in %.2fs, first accept to last settlement)\n", r.AppliedPerSec, r.Terminal, r.SettleSeconds)
	fmt.Fprintf(&b, "webhook-to-terminal latency: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		r.LatencyMillis["p50"], r.LatencyMillis["p95"], r.LatencyMillis["p99"], r.LatencyMillis["max"])
	outcomes := make([]string, 0, len(r.Outcomes))
	for k, v := range r.Outcomes {
		outcomes = append(outcomes, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(outcomes)
	fmt.Fprintf(&b, "outcomes: %s\n", strings.Join(outcomes, " "))
	if r.CPU != nil {
		fmt.Fprintf(&b, "CPU per terminal event over %.1fs (sending to last settlement):\n%s", r.CPU.WindowSeconds, r.CPU.Text())
	}
	verdict := "PASS"
	if !r.InvariantsOK {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "invariants: %s\n%s", verdict, r.InvariantsReport)
	return b.String()
}
