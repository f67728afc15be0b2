// Package chaos is settle's chaos soak: the real api, three workers and
// the scheduler under a steady webhook load while a fault injector, on a
// schedule drawn from a seed, kills and restarts them, restarts Redis
// (losing its data) and PostgreSQL, pauses PostgreSQL past the ledger's
// timeouts, and slows, resets and partitions their connections through
// TCP proxies. Afterwards every acknowledged event must be stored and
// settled exactly once and the books must balance.
//
//	go test ./test/chaos -run TestChaosSoak -v -chaos.duration=5m -chaos.seed=N
package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

var (
	flagDuration  = flag.Duration("chaos.duration", 60*time.Second, "how long faults are injected (the load runs as long)")
	flagSeed      = flag.Uint64("chaos.seed", 0, "seed of the fault schedule and the load (0: a new one, printed)")
	flagRate      = flag.Float64("chaos.rate", 40, "webhook events per second")
	flagSettle    = flag.Duration("chaos.settle", 3*time.Minute, "bound on the wait for every event to settle once faults stop")
	flagPgBouncer = flag.Bool("chaos.pgbouncer", false, "every process's DATABASE_URL through PgBouncer in transaction pooling (behind the fault proxies), the scheduler's LISTEN direct")
)

// Soak bounds.
const (
	userCount       = 16
	initialBalance  = "20"
	shutdownTimeout = 10 * time.Second
	// stopGrace is how long a process may take to exit after SIGTERM
	// before the soak calls it a failed shutdown.
	stopGrace = shutdownTimeout + 5*time.Second
	// stopSlack is the process's own teardown after SHUTDOWN_TIMEOUT's
	// drain (a -race build exits slower).
	stopSlack    = 2 * time.Second
	progressTick = 10 * time.Second
	logTailLines = 25
)

var assets = []string{"ETH", "USDC", "WBTC"}

func TestMain(m *testing.M) { testenv.Main(m) }

// soakSettings shorten settle's timers so that a fault's consequences
// play out within the soak: stale recovery within seconds, retries
// spread over a budget longer than a PostgreSQL restart, ledger timeouts
// shorter than a pause, and recovery attempts high enough that only a
// bug sends an event to the DLQ through them.
func soakSettings() map[string]string {
	return map[string]string{
		"LOG_LEVEL":                "info",
		"SHUTDOWN_TIMEOUT":         shutdownTimeout.String(),
		"DEPOSIT_FINALITY":         "none",
		"WEBHOOK_RATE_LIMIT":       "off",
		"POLL_INTERVAL":            "500ms",
		"STALE_ENQUEUED_AFTER":     "10s",
		"RECOVER_INTERVAL":         "2s",
		"MAX_RECOVERY_ATTEMPTS":    "1000",
		"DLQ_DRAIN_INTERVAL":       "5s",
		"RETRY_BASE_DELAY":         "1s",
		"RETRY_MAX_DELAY":          "10s",
		"LEDGER_LOCK_TIMEOUT":      "1s",
		"LEDGER_STATEMENT_TIMEOUT": "2s",
	}
}

// TestChaosSoak: load and faults for -chaos.duration, then everything
// is brought back, every event must settle, processes must stop cleanly,
// and the books must hold: nothing lost, nothing doubled, the invariants
// true, every dead letter explained by a fault.
func TestChaosSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos soak runs real processes for minutes; skipped with -short")
	}
	seed := *flagSeed
	if seed == 0 {
		seed = 1 + rand.Uint64N(1<<53) // prints and parses without surprises
	}
	duration := *flagDuration
	replay := fmt.Sprintf("go test ./test/chaos -run TestChaosSoak -count=1 -v -chaos.seed=%d -chaos.duration=%s -chaos.rate=%g -chaos.chain=%v -chaos.chainrate=%g -chaos.pgbouncer=%v -chaos.providers=%v -chaos.scaninterval=%s -chaos.forkrescan=%v",
		seed, duration, *flagRate, *flagChain, *flagChainRate, *flagPgBouncer, *flagProviders, *flagScanInterval, *flagForkRescan)
	t.Logf("chaos seed %d (replay: %s)", seed, replay)
	faults := planFaults(seed, duration, *flagChain)
	t.Logf("%d faults planned over %s", len(faults), duration)

	settings := soakSettings()
	notified := startReceiver(t, seed)
	notified.settings(settings)
	var rig *chainRig
	var prepare func(*harness.Stack)
	if *flagChain {
		rig = startChain(t, seed)
		rig.settings(settings)
		if *flagProviders {
			t.Log(providerSettings(settings, seed))
		}
		prepare = rig.prepare
	}
	c := newCluster(t, seed, settings, prepare)
	db := testenv.OpenDB(t, c.dsn)
	pool, err := pgxpool.New(context.Background(), c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	var v *verdict
	var s *sender
	var chainLoad *chainLoad
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(failureReport(c, seed, replay, s, chainLoad, v))
		}
	})

	initial := seedUsers(t, c, db)
	s = newSender(c.api().URL(), fmt.Sprintf("chaos%d", seed), seed, *flagRate, users(), assets)
	if rig != nil {
		c.rpc = rig.rpc
		rig.register(t, c.api().URL())
		chainLoad = newChainLoad(rig, c.api().URL(), fmt.Sprintf("chaos%d", seed), seed, *flagChainRate)
		c.reorg = chainLoad.reorg
		if *flagProviders {
			chainLoad.faults = newProviderFaults(seed, duration)
			t.Log(chainLoad.faults)
			waitScanCursor(t, pool)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	balances := watchBalances(watchCtx, pool)
	var breaker *breakerWatch
	if rig != nil {
		breaker = watchBreaker(watchCtx, c)
		if chainLoad.faults != nil {
			chainLoad.faults.scans = watchScan(watchCtx, c)
		}
	}
	replays := newReplayer(c.api().URL())
	replayCtx, stopReplaying := context.WithCancel(ctx)
	replaying := make(chan struct{})
	go func() { replays.run(replayCtx); close(replaying) }()
	defer func() { stopReplaying(); <-replaying }()
	superviseCtx, stopSupervising := context.WithCancel(ctx)
	supervised := make(chan struct{})
	go func() { c.supervise(superviseCtx); close(supervised) }()
	defer func() { stopSupervising(); <-supervised }()

	stopLoad := make(chan struct{})
	loadDone := make(chan struct{})
	chainDone := make(chan struct{})
	go func() { s.run(ctx, stopLoad); close(loadDone) }()
	go func() {
		if chainLoad != nil {
			chainLoad.run(ctx, stopLoad)
		}
		close(chainDone)
	}()

	c.timeline.add("fault phase: %d faults over %s", len(faults), duration)
	phase := time.Now()
	var injecting sync.WaitGroup
	for _, f := range faults {
		injecting.Go(func() {
			select {
			case <-time.After(time.Until(phase.Add(f.At))):
			case <-ctx.Done():
				return
			}
			c.inject(ctx, f)
		})
	}
	injecting.Wait()
	time.Sleep(time.Until(phase.Add(duration)))
	close(stopLoad)
	c.timeline.add("fault phase over; load stops")

	if err := c.restore(ctx); err != nil {
		t.Fatalf("bringing the system back: %v", err)
	}
	select {
	case <-loadDone:
	case <-time.After(deliveryMax + time.Minute):
		t.Fatal("the load's deliveries did not finish")
	}
	select {
	case <-chainDone:
	case <-time.After(deliveryMax + time.Minute):
		t.Fatal("the chain load's reports did not finish")
	}
	c.timeline.add("load done: %s", strings.TrimSpace(strings.SplitN(s.summary(), "\n", 2)[0]))
	if chainLoad != nil {
		c.timeline.add("chain load done: %s", strings.TrimSpace(strings.SplitN(chainLoad.summary(), "\n", 2)[0]))
	}

	stopReplaying()
	<-replaying
	replays.once() // what the faults' last moments dead-lettered
	if err := waitSettled(ctx, t, c, pool, *flagSettle); err != nil {
		c.timeline.add("not settled: %v", err)
		t.Errorf("events did not settle: %v", err)
	} else {
		c.timeline.add("every event settled; the DLQ fallback is empty")
	}
	if rig != nil && !t.Failed() {
		// Let the reorg watch finish with every credited deposit, then
		// settle whatever it decided (a compensation is an event too).
		if chainLoad.faults != nil {
			waitScanned(ctx, t, c, rig, pool) // what no provider reported
		}
		waitFinal(ctx, t, c, rig, pool)
		if err := waitSettled(ctx, t, c, pool, *flagSettle); err != nil {
			c.timeline.add("not settled after finality: %v", err)
			t.Errorf("events did not settle after finality: %v", err)
		}
	}

	if !t.Failed() {
		if err := waitNotified(ctx, c, pool); err != nil {
			t.Errorf("notifications: %v", err)
		}
	}
	if chainLoad != nil && chainLoad.faults != nil {
		chainLoad.faults.scans.sampleOnce(c)
	}
	stopSupervising()
	<-supervised
	stopAll(t, c)

	checkCtx, cancelCheck := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelCheck()
	stopWatching()
	v = verify(checkCtx, db, pool, s, initial, c.timeline.faultWindows())
	if chainLoad != nil {
		verifyChain(checkCtx, v, pool, chainLoad, rig, c.timeline.faultWindows())
	}
	verifyNotifications(checkCtx, v, pool, notified)
	verifyReplays(checkCtx, v, pool, replays)
	c.checkStops(v)
	c.bouncerCrashes(v)
	balances.sample(checkCtx, pool) // once more, on the quiet books
	balances.report(v)
	if breaker != nil {
		v.note("chain: %s", breaker)
	}
	for _, m := range c.members {
		for _, line := range strings.Split(m.proc.Logs(), "\n") {
			if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
				v.fail("process crashed", "%s: %s", m.name, line)
			}
		}
	}
	if testing.Verbose() && !t.Failed() && len(v.kinds) == 0 {
		t.Logf("fault timeline:\n%s", c.timeline)
	}
	t.Logf("seed %d: %s", seed, strings.TrimSpace(s.summary()))
	if chainLoad != nil {
		t.Logf("seed %d: %s", seed, strings.TrimSpace(chainLoad.summary()))
	}
	t.Logf("processes: %s; proxies: %s", c.restarts(), c.proxyStats())
	for _, n := range v.notes {
		t.Log(n)
	}
	for _, f := range v.findings() {
		t.Error(f)
	}
}

func users() []int64 {
	out := make([]int64, userCount)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

// seedUsers creates the users through the admin API and gives each an
// initial balance per asset, for withdrawals to draw on.
func seedUsers(t *testing.T, c *cluster, db interface {
	SetInitialBalance(context.Context, int64, string, decimal.Decimal) error
}) map[balanceKey]decimal.Decimal {
	t.Helper()
	client := harness.NewClient(c.api().URL())
	initial := map[balanceKey]decimal.Decimal{}
	amount := decimal.RequireFromString(initialBalance)
	for _, id := range users() {
		status, body, err := client.Admin(http.MethodPut, fmt.Sprintf("/admin/users/%d", id), nil)
		if err != nil || (status != http.StatusCreated && status != http.StatusOK) {
			t.Fatalf("create user %d: %d %v %v", id, status, body, err)
		}
		for _, asset := range assets {
			if err := db.SetInitialBalance(context.Background(), id, asset, amount); err != nil {
				t.Fatalf("initial balance: %v", err)
			}
			initial[balanceKey{id, asset}] = amount
		}
	}
	return initial
}

// waitSettled waits, bounded, until every event is confirmed or failed
// and no dead letter is still parked in Redis.
func waitSettled(ctx context.Context, t *testing.T, c *cluster, pool *pgxpool.Pool, bound time.Duration) error {
	rdb := c.redisClient()
	defer rdb.Close()
	deadline := time.Now().Add(bound)
	lastProgress := time.Now()
	var last string
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var open, total int
		err := pool.QueryRow(qctx, `SELECT count(*) FILTER (WHERE status NOT IN ('confirmed', 'failed')), count(*) FROM payment_events`).Scan(&open, &total)
		var parked int64
		if err == nil {
			var n, m int64
			n, err = rdb.LLen(qctx, dlq.FallbackKey).Result()
			if err == nil {
				m, err = rdb.LLen(qctx, "settle:dlq:draining").Result()
			}
			parked = n + m
		}
		cancel()
		if err == nil {
			last = fmt.Sprintf("%d of %d events not terminal, %d dead letters parked in Redis", open, total, parked)
			if open == 0 && parked == 0 {
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Since(lastProgress) >= progressTick {
			t.Logf("settling: %s", last)
			lastProgress = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s%s", bound, last, openSample(ctx, pool))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func openSample(ctx context.Context, pool *pgxpool.Pool) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT event_id, status, retry_count, generation, updated_at FROM payment_events
		WHERE status NOT IN ('confirmed', 'failed') ORDER BY updated_at LIMIT 10`)
	if err != nil {
		return ""
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, status string
		var retries, gen int
		var updated time.Time
		if rows.Scan(&id, &status, &retries, &gen, &updated) == nil {
			fmt.Fprintf(&b, "\n  %s %s retries=%d generation=%d updated=%s", id, status, retries, gen, updated.Format("15:04:05.000"))
		}
	}
	return b.String()
}

// Finality wait bounds (chain mode).
const (
	watchEndMax  = time.Minute
	watchEndPoll = 500 * time.Millisecond
)

// waitFinal seals blocks until every transfer's block is finalized and
// waits, bounded, until the reorg watch has let go of every deposit.
func waitFinal(ctx context.Context, t *testing.T, c *cluster, rig *chainRig, pool *pgxpool.Pool) {
	head, err := rig.chain.Head(ctx)
	if err == nil {
		err = rig.chain.FinalizeThrough(ctx, head)
	}
	if err != nil {
		t.Errorf("finalize the chain: %v", err)
		return
	}
	c.timeline.add("chain finalized through block %d", head)
	deadline := time.Now().Add(watchEndMax)
	for {
		var watching int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.QueryRow(qctx, `SELECT count(*) FROM payment_events WHERE chain_state = 'watching'`).Scan(&watching)
		cancel()
		if err == nil && watching == 0 {
			c.timeline.add("no deposit watched any more")
			return
		}
		if time.Now().After(deadline) {
			c.timeline.add("after %s, %d deposits still watched (err %v)", watchEndMax, watching, err)
			return
		}
		time.Sleep(watchEndPoll)
	}
}

// stopAll sends SIGTERM to every process at once; each must exit 0
// within SHUTDOWN_TIMEOUT (plus a margin).
func stopAll(t *testing.T, c *cluster) {
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Go(func() {
			started := time.Now()
			code := m.proc.Stop(stopGrace)
			c.timeline.add("%s stopped: exit %d after %s", m.name, code, time.Since(started).Round(time.Millisecond))
			if code != 0 {
				t.Errorf("%s did not shut down cleanly: exit code %d (SIGKILL after %s gives -1)\n%s", m.name, code, stopGrace, tail(m.proc.Logs(), 10))
			}
		})
	}
	wg.Wait()
}

// failureReport is everything needed to understand and replay a failed
// soak; the full logs go to a directory that outlives the test.
func failureReport(c *cluster, seed uint64, replay string, s *sender, l *chainLoad, v *verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n==== CHAOS SOAK FAILED — seed %d ====\nreplay: %s\n", seed, replay)
	fmt.Fprintf(&b, "\n---- fault timeline ----\n%s\n", c.timeline)
	if s != nil {
		fmt.Fprintf(&b, "\n---- load ----\n%s", s.summary())
	}
	if l != nil {
		fmt.Fprintf(&b, "%s", l.summary())
	}
	if v != nil {
		fmt.Fprintf(&b, "\n---- invariant report ----\n%s", v.report)
		fmt.Fprintf(&b, "\n---- findings ----\n%s\n", strings.Join(v.findings(), "\n"))
		b.WriteString(traceLogs(c, v.traces))
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("settle-chaos-%d-", seed))
	for _, m := range c.members {
		fmt.Fprintf(&b, "\n---- %s (killed %d times, exited on its own %d times): warnings and errors, last %d ----\n%s\n",
			m.name, m.kills, m.exits, logTailLines, tail(notable(m.proc.Logs()), logTailLines))
		if err == nil {
			_ = os.WriteFile(filepath.Join(dir, m.name+".log"), []byte(m.proc.Logs()), 0o644)
		}
	}
	if err == nil {
		fmt.Fprintf(&b, "\nfull process logs: %s\n", dir)
	}
	return b.String()
}

// notable keeps the log lines above info level.
func notable(logs string) string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if line != "" && !strings.Contains(line, `"level":"info"`) && !strings.Contains(line, `"level":"debug"`) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Bounds of the log excerpts of a failure report.
const (
	traceSubjectsMax = 8
	traceLinesMax    = 80
)

// traceLogs is every process's log lines naming a traced subject (an
// event id, a transaction hash) and the trace ids those lines carry: what
// the watcher, the gate and the ledger said about a suspicious deposit.
func traceLogs(c *cluster, subjects []string) string {
	if len(subjects) > traceSubjectsMax {
		subjects = subjects[:traceSubjectsMax]
	}
	var b strings.Builder
	for _, subject := range subjects {
		keys := []string{subject}
		logs := map[string][]string{}
		for _, m := range c.members {
			logs[m.name] = strings.Split(m.proc.Logs(), "\n")
			for _, line := range logs[m.name] {
				if strings.Contains(line, subject) {
					if _, rest, ok := strings.Cut(line, `"trace_id":"`); ok {
						if id, _, ok := strings.Cut(rest, `"`); ok && id != "" && !slices.Contains(keys, id) {
							keys = append(keys, id)
						}
					}
				}
			}
		}
		fmt.Fprintf(&b, "\n---- log lines naming %s (or its traces %v) ----\n", subject, keys[1:])
		n := 0
		for _, m := range c.members {
			for _, line := range logs[m.name] {
				for _, k := range keys {
					if strings.Contains(line, k) {
						if n < traceLinesMax {
							fmt.Fprintf(&b, "%s: %s\n", m.name, line)
						}
						n++
						break
					}
				}
			}
		}
		if n > traceLinesMax {
			fmt.Fprintf(&b, "... and %d more lines\n", n-traceLinesMax)
		}
	}
	return b.String()
}
