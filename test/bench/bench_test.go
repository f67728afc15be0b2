package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

var (
	flagEvents      = flag.Int("e2e.events", 20_000, "events per end-to-end run")
	flagRate        = flag.Float64("e2e.rate", 0, "events per second (0: as fast as possible)")
	flagConcurrency = flag.Int("e2e.concurrency", 64, "webhook requests in flight")
	flagUsers       = flag.Int("e2e.users", 100, "distinct users")
	flagWorkers     = flag.Int("e2e.workers", 1, "worker processes")
	flagWorkerConc  = flag.Int("e2e.worker-concurrency", 64, "WORKER_CONCURRENCY of each worker")
	flagWithdrawals = flag.Int("e2e.withdrawals", 0, "percent withdrawals")
	flagHolds       = flag.Int("e2e.holds", 0, "percent withdrawal holds, each then posted (3 in 4) or voided")
	flagDuplicates  = flag.Int("e2e.duplicates", 20, "percent duplicate deliveries")
	flagAssets      = flag.String("e2e.assets", "ETH", "assets")
	flagInitial     = flag.String("e2e.initial-balance", "1000", "initial balance per user and asset")
	flagOut         = flag.String("e2e.out", "", "write the result as JSON here")
	flagExtraEnv    = flag.String("e2e.env", "", "extra settings for every process, NAME=VALUE,NAME=VALUE")
	flagBacklog     = flag.Bool("e2e.backlog", false, "start the workers only once every webhook is stored, so the whole run waits as a backlog")
)

func TestMain(m *testing.M) {
	if role := os.Getenv(floorRoleVar); role != "" {
		os.Exit(floorChild(role))
	}
	testenv.Main(m)
}

// report is one end-to-end run as BENCHMARKS.md shows it.
type report struct {
	Config        map[string]any     `json:"config"`
	Load          loadgen.Result     `json:"load"`
	WindowSeconds float64            `json:"window_seconds"`
	CPU           loadgen.CPUUse     `json:"cpu"`
	CPUMsPerEvent map[string]float64 `json:"cpu_ms_per_event"`
	PeakRSSMiB    map[string]float64 `json:"peak_rss_mib"`
	// Write transactions (those given a transaction id) per terminal event.
	WriteXactsPerEvent float64 `json:"write_xacts_per_event"`
	// Redis commands the server processed per terminal event.
	RedisCommandsPerEvent float64 `json:"redis_commands_per_event"`
}

// BenchmarkEndToEnd runs the whole system (api, workers, scheduler as
// separate processes, PostgreSQL with fsync and synchronous_commit on,
// Redis) under the load tool, once per b.N, and reports applied events
// per second, latency and CPU per event of every process.
func BenchmarkEndToEnd(b *testing.B) {
	for range b.N {
		r := runEndToEnd(b)
		b.ReportMetric(r.Load.AppliedPerSec, "applied/s")
		b.ReportMetric(r.Load.AcceptedPerSec, "accepted/s")
		b.ReportMetric(r.Load.LatencyMillis["p50"], "p50-ms")
		b.ReportMetric(r.Load.LatencyMillis["p99"], "p99-ms")
		b.ReportMetric(r.CPUMsPerEvent["total"], "cpu-ms/event")
		// The host's share: a run with much of it measured the host too.
		b.ReportMetric(r.CPU.StealCorePercent, "steal-core-%")
		// The same work measured against the load generator's unchanged
		// code: what compares sittings on hosts of different speeds.
		if ratio, ok := r.loadgenRatio(); ok {
			b.ReportMetric(ratio, "x-loadgen")
		}
	}
}

func runEndToEnd(b *testing.B) report {
	s := harness.NewStack(b)
	rds := ownRedis(b, s)
	s.Env["LOG_LEVEL"] = "warn"
	s.Env["WORKER_CONCURRENCY"] = strconv.Itoa(*flagWorkerConc)
	// The deployed defaults, not the harness's short test intervals.
	s.Env["POLL_INTERVAL"] = "5s"
	delete(s.Env, "WORKER_POLL_INTERVAL")
	applyEnv(s.Env, *flagExtraEnv)
	api := s.StartAPI(nil)
	scheduler := s.StartScheduler(nil)
	pg := testenv.Postgres(b)
	if pg == nil {
		b.Fatal("the end-to-end benchmark needs the harness's own PostgreSQL (unset TEST_DATABASE_URL)")
	}

	procs := []loadgen.Proc{
		{Name: "api", Pid: api.Pid()}, {Name: "scheduler", Pid: scheduler.Pid()},
		{Name: "postgres", Pid: pg.Pid()}, {Name: "redis", Pid: rds.Pid()},
	}
	var workers []*harness.Proc
	startWorkers := func() {
		for i := range *flagWorkers {
			w := s.StartWorker(nil)
			workers = append(workers, w)
			procs = append(procs, loadgen.Proc{Name: fmt.Sprintf("worker-%d", i), Pid: w.Pid()})
		}
	}
	if !*flagBacklog {
		startWorkers()
	}
	sample := func() loadgen.CPUSample {
		v, err := loadgen.SampleCPU(procs)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}

	db := testenv.OpenDB(b, s.DatabaseURL)
	var before, after loadgen.CPUSample
	var xidBefore, xidAfter, redisBefore, redisAfter int64
	var windowStart, windowEnd time.Time
	ctx := context.Background()
	cfg := loadgen.Config{
		APIURL: api.URL(), WebhookSecret: harness.WebhookSecret, AdminToken: harness.AdminToken, DB: db,
		Events: *flagEvents, Rate: *flagRate, Concurrency: *flagConcurrency, Users: *flagUsers,
		Assets: strings.Split(*flagAssets, ","), InitialBalance: *flagInitial, WaitTimeout: 20 * time.Minute, Seed: 1,
		Mix: loadgen.Mix{Withdrawals: *flagWithdrawals, Holds: *flagHolds, Duplicates: *flagDuplicates},
		OnSending: func() {
			xidBefore, redisBefore = nextXid(b, s.DatabaseURL), redisCommands(b, s.RedisURL)
			before, windowStart = sample(), time.Now()
		},
		OnSettled: func() {
			after, windowEnd = sample(), time.Now()
			xidAfter, redisAfter = nextXid(b, s.DatabaseURL), redisCommands(b, s.RedisURL)
		},
	}
	if *flagBacklog {
		cfg.OnIngested = startWorkers
	}
	result, err := loadgen.Run(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if !result.InvariantsOK || result.Unexpected > 0 {
		b.Fatalf("run failed its checks (unexpected answers %d):\n%s", result.Unexpected, result.InvariantsReport)
	}

	use := loadgen.CPUBetween(before, after, result.Terminal)
	r := report{
		Config: map[string]any{
			"events": *flagEvents, "rate": *flagRate, "concurrency": *flagConcurrency, "users": *flagUsers,
			"workers": *flagWorkers, "worker_concurrency": *flagWorkerConc, "withdrawals_pct": *flagWithdrawals, "holds_pct": *flagHolds,
			"duplicates_pct": *flagDuplicates, "assets": *flagAssets, "env": *flagExtraEnv, "backlog": *flagBacklog,
		},
		Load:          result,
		WindowSeconds: windowEnd.Sub(windowStart).Seconds(),
		CPU:           use,
		CPUMsPerEvent: use.MsPerEvent,
		PeakRSSMiB:    map[string]float64{"api": loadgen.PeakRSSMiB(api.Pid()), "scheduler": loadgen.PeakRSSMiB(scheduler.Pid()), "redis": loadgen.PeakRSSMiB(rds.Pid())},
	}
	for i, w := range workers {
		r.PeakRSSMiB[fmt.Sprintf("worker-%d", i)] = loadgen.PeakRSSMiB(w.Pid())
	}
	r.WriteXactsPerEvent = float64(xidAfter-xidBefore) / float64(result.Terminal)
	// Less the INFO call that read the second figure.
	r.RedisCommandsPerEvent = float64(redisAfter-redisBefore-1) / float64(result.Terminal)
	// Printed, not logged: the testing package truncates a benchmark's log.
	fmt.Println(r.text())
	if *flagOut != "" {
		data, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*flagOut, data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

func (r report) text() string {
	var sb strings.Builder
	l := r.Load
	fmt.Fprintf(&sb, "events %d (+%d duplicate deliveries), %d terminal\n", l.Events, l.Answers["200 duplicate"], l.Terminal)
	fmt.Fprintf(&sb, "accepted/s %.1f, applied/s %.1f (window %.2fs)\n", l.AcceptedPerSec, l.AppliedPerSec, r.WindowSeconds)
	fmt.Fprintf(&sb, "webhook round trip p50 %.1f ms p99 %.1f ms; webhook-to-terminal p50 %.1f ms p95 %.1f ms p99 %.1f ms max %.1f ms\n",
		l.RequestMillis["p50"], l.RequestMillis["p99"], l.LatencyMillis["p50"], l.LatencyMillis["p95"], l.LatencyMillis["p99"], l.LatencyMillis["max"])
	sb.WriteString(r.CPU.Text())
	// The load generator's work per event is the same whatever settle's
	// tree, so this ratio moves less with the host's speed than the CPU
	// figures do: it is what compares runs of different sittings.
	if ratio, ok := r.loadgenRatio(); ok {
		fmt.Fprintf(&sb, "CPU per event relative to the load generator's: %.2f\n", ratio)
	}
	fmt.Fprintf(&sb, "PostgreSQL write transactions: %.3f per event; Redis commands: %.2f per event\n", r.WriteXactsPerEvent, r.RedisCommandsPerEvent)
	rss := make([]string, 0, len(r.PeakRSSMiB))
	for n, v := range r.PeakRSSMiB {
		rss = append(rss, fmt.Sprintf("%s %.1f MiB", n, v))
	}
	sort.Strings(rss)
	fmt.Fprintf(&sb, "peak RSS: %s\n", strings.Join(rss, ", "))
	fmt.Fprintf(&sb, "invariants: %v\n%s", l.InvariantsOK, l.InvariantsReport)
	return sb.String()
}

// loadgenRatio is settle's CPU per event over the load generator's,
// false when the load generator used none.
func (r report) loadgenRatio() (float64, bool) {
	lg := r.CPUMsPerEvent[loadgen.CPULoadGenerator]
	if lg <= 0 {
		return 0, false
	}
	return r.CPUMsPerEvent["total"] / lg, true
}

// applyEnv sets the NAME=VALUE,NAME=VALUE settings of -e2e.env.
func applyEnv(env map[string]string, spec string) {
	for _, kv := range strings.Split(spec, ",") {
		if name, value, ok := strings.Cut(kv, "="); ok {
			env[name] = value
		}
	}
}

// redisCommands is the Redis server's total_commands_processed.
func redisCommands(b *testing.B, url string) int64 {
	rdb, err := redisconn.Open(url)
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// nextXid is the transaction id PostgreSQL hands out next: read without
// taking one, so the difference over a window counts the write
// transactions committed or rolled back in it, with no statistics delay.
func nextXid(b *testing.B, dsn string) int64 {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var xid int64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&xid); err != nil {
		b.Fatal(err)
	}
	return xid
}

var flagSharedRedis = flag.Bool("bench.shared-redis", false, "run against the test harness's shared Redis (4096 databases, --hz 10), as before session 10, instead of the run's own")

// ownRedis starts the run's own Redis as the dev stack configures it (16
// databases, --hz devenv.RedisHzDeployed; no append-only file, as the
// shared server) and points the stack at it. The harness's shared server
// keeps 4096 databases for tests in parallel, and Redis's housekeeping
// visits them: that alone doubled its idle CPU against a deployment's.
func ownRedis(b *testing.B, s *harness.Stack) *devenv.Redis {
	b.Helper()
	if *flagSharedRedis {
		rds := testenv.Redis(b)
		if rds == nil {
			b.Fatal("-bench.shared-redis needs the harness's own Redis (unset TEST_REDIS_URL)")
		}
		return rds
	}
	rds, err := devenv.StartRedis(b.Context(), devenv.RedisOptions{Hz: devenv.RedisHzDeployed})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rds.Close)
	s.RedisURL = rds.URL(0)
	s.Env["REDIS_URL"] = s.RedisURL
	return rds
}
