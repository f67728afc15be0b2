package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// Cluster bounds.
const (
	// restartBackoff spaces the supervisor's restarts of a process that
	// keeps exiting (its database is down, say), as an orchestrator would.
	restartBackoff = time.Second
	superviseEvery = 250 * time.Millisecond
	// serverStartAttempts bounds the injector's tries to bring a backend
	// back; the restore phase tries again.
	serverStartAttempts = 3
	readyTimeout        = 90 * time.Second
	sentinelKey         = "settle:chaos:sentinel"
)

// cluster is everything the soak runs: the backends, the proxies in
// front of them, and settle's processes under a supervisor.
type cluster struct {
	t        *testing.T
	stack    *harness.Stack
	pg       *devenv.Postgres
	redis    *devenv.Redis
	dsn      string // direct, for the test's own checks
	redisURL string // direct
	proxies  map[string]*proxy
	rpc      *rpcProxy // chain mode: between the workers and the node
	// reorg, in chain mode, forks the chain to drop a recent transfer at
	// most depth blocks deep and says what it did.
	reorg    func(ctx context.Context, depth uint64) string
	members  []*member
	timeline *timeline
	// bouncer, in PgBouncer mode, pools every process's DATABASE_URL.
	bouncer *devenv.PgBouncer

	stopMu sync.Mutex
	stops  []stopRecord // graceful stops under load
}

// stopRecord is one SIGTERM under load and how the process took it.
type stopRecord struct {
	name    string
	pid     int
	code    int
	took    time.Duration
	serving bool   // it answered /readyz when SIGTERM came
	last    string // its last log line
}

func (c *cluster) recordStop(r stopRecord) {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	c.stops = append(c.stops, r)
}

// checkStops: every SIGTERM under load ended in exit 0 within
// SHUTDOWN_TIMEOUT (plus stopSlack for the process's own teardown).
func (c *cluster) checkStops(v *verdict) {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	slowest := time.Duration(0)
	starting := map[int]int{} // exit codes of processes stopped before ready
	var startingSample []string
	for _, s := range c.stops {
		if !s.serving {
			starting[s.code]++
			if s.code != 0 && len(startingSample) < findingSamples {
				startingSample = append(startingSample, fmt.Sprintf("%s pid %d exit %d: %s", s.name, s.pid, s.code, s.last))
			}
			continue
		}
		slowest = max(slowest, s.took)
		if s.code != 0 || s.took > shutdownTimeout+stopSlack {
			v.fail("GRACEFUL SHUTDOWN FAILED UNDER LOAD", "%s pid %d: exit %d after %s (SHUTDOWN_TIMEOUT %s; -1 is a SIGKILL after %s); last log: %s", s.name, s.pid, s.code, s.took.Round(time.Millisecond), shutdownTimeout, stopGrace, s.last)
		}
	}
	v.note("graceful stops under load: %d, slowest %s; SIGTERMs of processes still starting, by exit code: %v %q", len(c.stops), slowest.Round(time.Millisecond), starting, startingSample)
}

// member is one settle process and what the injector and the
// supervisor know about it.
type member struct {
	name string
	proc *harness.Proc

	mu        sync.Mutex
	held      bool // down on purpose: the supervisor leaves it alone
	lastStart time.Time
	// faulting is held through a kill or a stop and its restart.
	faulting sync.Mutex
	kills    int
	stops    int // graceful stops under load
	exits    int // exits nobody asked for
}

// startProc runs the process again and remembers when.
func (m *member) startProc() {
	m.proc.Start()
	m.lastStart = time.Now()
}

// newCluster starts PostgreSQL and Redis (the package's own, or ours if
// the environment points elsewhere), one proxy per link, and settle:
// api, three workers, the scheduler. prepare, if set, runs on the fresh
// database before any process starts (the asset registry is read at
// start).
func newCluster(t *testing.T, seed uint64, settings map[string]string, prepare func(*harness.Stack)) *cluster {
	t.Helper()
	c := &cluster{t: t, stack: harness.NewStack(t), proxies: map[string]*proxy{}, timeline: newTimeline()}
	c.pg, c.dsn = testenv.Postgres(t), c.stack.DatabaseURL
	c.redis, c.redisURL = testenv.Redis(t), c.stack.RedisURL
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c.pg == nil {
		// TEST_DATABASE_URL names a server we must not stop: run our own.
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
		if err != nil {
			t.Fatalf("own PostgreSQL: %v", err)
		}
		t.Cleanup(pg.Close)
		c.pg, c.dsn = pg, pg.URL("postgres")
		db, err := postgres.Open(ctx, c.dsn, postgres.Options{ConnsMax: 2})
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.Migrate(ctx)
		db.Close()
		if err != nil {
			t.Fatalf("migrate own PostgreSQL: %v", err)
		}
	}
	if c.redis == nil {
		rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{})
		if err != nil {
			t.Fatalf("own Redis: %v", err)
		}
		t.Cleanup(rds.Close)
		c.redis, c.redisURL = rds, rds.URL(1)
	}
	pgUpstream := fmt.Sprintf("127.0.0.1:%d", c.pg.Port)
	if *flagPgBouncer {
		c.bouncer = startBouncer(t, c.pg.Port, c.dsn)
		pgUpstream = c.bouncer.Addr()
	}
	for i, name := range links {
		upstream := pgUpstream
		if strings.HasSuffix(name, "→redis") {
			upstream = c.redis.Addr()
		}
		c.proxies[name] = newProxy(t, name, upstream, seed+uint64(i))
	}
	for k, v := range settings {
		c.stack.Env[k] = v
	}
	if prepare != nil {
		prepare(c.stack)
	}
	via := func(group string) map[string]string {
		env := map[string]string{
			"DATABASE_URL": rehost(t, c.dsn, c.proxies[group+"→pg"].Addr()),
			"REDIS_URL":    rehost(t, c.redisURL, c.proxies[group+"→redis"].Addr()),
		}
		if c.bouncer != nil {
			// Through the proxy to the pooler; LISTEN is session state,
			// so the scheduler's listener goes to PostgreSQL directly.
			env["DATABASE_URL"] = rehost(t, c.bouncer.URL(dbUser(t, c.dsn), dbName(t, c.dsn), bouncerExecMode), c.proxies[group+"→pg"].Addr())
			env["DATABASE_LISTEN_URL"] = c.dsn
		}
		return env
	}
	c.members = append(c.members, &member{name: "api", proc: c.stack.StartAPI(via("api"))})
	for i := 1; i <= workerCount; i++ {
		c.members = append(c.members, &member{name: fmt.Sprintf("worker-%d", i), proc: c.stack.StartWorker(via("workers"))})
	}
	c.members = append(c.members, &member{name: "scheduler", proc: c.stack.StartScheduler(via("scheduler"))})
	for _, m := range c.members {
		m.lastStart = time.Now()
	}
	return c
}

// PgBouncer mode bounds.
const (
	// bouncerPoolSize is the server connections PgBouncer opens per
	// database: fewer than the processes' pools hold between them, so
	// their transactions share server connections.
	bouncerPoolSize = 12
	// bouncerExecMode is what settle's DATABASE_URL needs behind PgBouncer
	// in transaction pooling (test/scale's TestPgBouncerExecModes).
	bouncerExecMode = "default_query_exec_mode=cache_describe"
)

// bouncerDialTimeout bounds the supervisor's check that PgBouncer listens.
const bouncerDialTimeout = 200 * time.Millisecond

// superviseBouncer starts PgBouncer again if it died, as systemd would:
// Debian's 1.18 can crash on a cancel request racing a disconnect
// (pgbouncer/pgbouncer#801, fixed in 1.20), and pgx sends cancel requests
// whenever a query's context ends. Crashes are counted from its log.
func (c *cluster) superviseBouncer(ctx context.Context) {
	if c.bouncer == nil {
		return
	}
	conn, err := net.DialTimeout("tcp", c.bouncer.Addr(), bouncerDialTimeout)
	if err == nil {
		conn.Close()
		return
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.bouncer.Start(startCtx); err != nil {
		c.timeline.add("pgbouncer not listening; start failed: %v", err)
		return
	}
	c.timeline.add("pgbouncer not listening (%v); started again", err)
}

// bouncerCrashes notes PgBouncer's own fatal errors: not settle's bug,
// but an operator's (run PgBouncer ≥ 1.20).
func (c *cluster) bouncerCrashes(v *verdict) {
	if c.bouncer == nil {
		return
	}
	var fatal []string
	for _, line := range strings.Split(c.bouncer.Log(), "\n") {
		if strings.Contains(line, " FATAL ") {
			fatal = append(fatal, line)
		}
	}
	v.note("pgbouncer: %d crashes, each restarted by the supervisor %q", len(fatal), fatal)
}

// startBouncer runs PgBouncer, transaction pooling, in front of the
// soak's PostgreSQL; it lives through PostgreSQL's restarts and crashes
// (its server connections die with them and are opened again).
func startBouncer(t *testing.T, pgPort int, dsn string) *devenv.PgBouncer {
	t.Helper()
	if _, err := devenv.PgBouncerPath(); err != nil {
		t.Fatalf("-chaos.pgbouncer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := devenv.StartPgBouncer(ctx, devenv.PgBouncerOptions{
		PostgresHost: "127.0.0.1", PostgresPort: pgPort, PoolMode: "transaction",
		DefaultPoolSize: bouncerPoolSize, Users: []string{dbUser(t, dsn)},
	})
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- pgbouncer log (tail) ----\n%s", tail(b.Log(), 30))
		}
		b.Close()
	})
	return b
}

func dbUser(t testing.TB, dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u.User.Username()
}

func dbName(t testing.TB, dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func rehost(t testing.TB, raw, hostPort string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostPort
	return u.String()
}

func (c *cluster) member(name string) *member {
	for _, m := range c.members {
		if m.name == name {
			return m
		}
	}
	c.t.Errorf("no process %q", name)
	return nil
}

func (c *cluster) api() *harness.Proc { return c.member("api").proc }

// supervise restarts processes that died without being asked to, until
// ctx ends: the restart policy of systemd or Kubernetes.
func (c *cluster) supervise(ctx context.Context) {
	ticker := time.NewTicker(superviseEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		c.superviseBouncer(ctx)
		for _, m := range c.members {
			m.mu.Lock()
			if !m.held && !m.proc.Running() && time.Since(m.lastStart) >= restartBackoff {
				m.exits++
				c.timeline.add("%s exited on its own; restarting (last log: %s)", m.name, lastLine(m.proc.Logs()))
				m.startProc()
			}
			m.mu.Unlock()
		}
	}
}

// inject runs one fault to its end. It always undoes what it did, even
// when ctx ends early, so that nothing stays broken.
func (c *cluster) inject(ctx context.Context, f fault) {
	from := time.Now()
	hold := func() {
		select {
		case <-time.After(f.Hold):
		case <-ctx.Done():
		}
	}
	var note string
	switch f.Kind {
	case killWorker, killScheduler, killAPI:
		m := c.member(f.Target)
		// A graceful stop may outlast its planned window (it drains for
		// up to SHUTDOWN_TIMEOUT): faults on one process take turns.
		m.faulting.Lock()
		defer m.faulting.Unlock()
		m.mu.Lock()
		m.held = true
		m.mu.Unlock()
		pid := m.proc.Pid()
		m.proc.Kill()
		c.timeline.add("%v: SIGKILL pid %d", f, pid)
		hold()
		m.mu.Lock()
		m.kills++
		m.held = false
		if !m.proc.Running() {
			m.startProc()
		}
		m.mu.Unlock()
		note = "restarted"
	case stopWorker, stopScheduler, stopAPI:
		m := c.member(f.Target)
		m.faulting.Lock()
		defer m.faulting.Unlock()
		m.mu.Lock()
		m.held = true
		running := m.proc.Running()
		m.mu.Unlock()
		if !running {
			// It exited on its own (its database unreachable, say) and the
			// supervisor has not restarted it yet: nothing to stop.
			m.mu.Lock()
			m.held = false
			m.mu.Unlock()
			note = "not running: SIGTERM skipped"
			break
		}
		pid := m.proc.Pid()
		// Only a process that serves is judged: one still starting (its
		// database paused, say) may give up its start with an error.
		serving := ready(m.proc)
		c.timeline.add("%v: SIGTERM pid %d (ready: %v)", f, pid, serving)
		started := time.Now()
		code := m.proc.Stop(stopGrace)
		took := time.Since(started)
		c.recordStop(stopRecord{name: m.name, pid: pid, code: code, took: took, serving: serving, last: lastLine(m.proc.Logs())})
		hold()
		m.mu.Lock()
		m.stops++
		m.held = false
		if !m.proc.Running() {
			m.startProc()
		}
		m.mu.Unlock()
		note = fmt.Sprintf("exit %d after %s; restarted", code, took.Round(time.Millisecond))
	case redisRestart:
		c.setSentinel(ctx)
		c.redis.Stop()
		c.timeline.add("%v: Redis stopped", f)
		hold()
		c.startServer(ctx, "redis", func(ctx context.Context) error { return c.redis.Start(ctx) })
		note = "started; data lost: " + c.sentinelGone(ctx)
	case pgRestart:
		c.pg.Stop()
		c.timeline.add("%v: PostgreSQL stopped (fast)", f)
		hold()
		c.startServer(ctx, "postgres", c.pg.Start)
		note = "started"
	case pgKill:
		c.pg.Kill()
		c.timeline.add("%v: PostgreSQL killed", f)
		hold()
		c.startServer(ctx, "postgres", c.pg.Start)
		note = "started after crash recovery"
	case pgPause:
		if err := c.pg.Pause(); err != nil {
			c.timeline.add("%v: pause failed: %v", f, err)
		}
		c.timeline.add("%v: PostgreSQL paused", f)
		hold()
		if err := c.pg.Resume(); err != nil {
			c.timeline.add("%v: resume failed: %v", f, err)
		}
		note = "resumed"
	case linkLatency:
		for _, name := range linkTargets(f.Target) {
			c.proxies[name].SetLatency(f.Latency)
		}
		c.timeline.add("%v: latency on", f)
		hold()
		for _, name := range linkTargets(f.Target) {
			c.proxies[name].SetLatency(0)
		}
		note = "latency off"
	case linkReset:
		n := 0
		for _, name := range linkTargets(f.Target) {
			n += c.proxies[name].ResetAll()
		}
		note = fmt.Sprintf("%d connections reset", n)
	case linkBlackhole:
		for _, name := range linkTargets(f.Target) {
			c.proxies[name].Blackhole()
		}
		c.timeline.add("%v: blackhole on", f)
		hold()
		for _, name := range linkTargets(f.Target) {
			c.proxies[name].Heal()
		}
		note = "healed"
	case rpcNulls, rpcErrors, rpcReset, rpcLatency, rpcBlackhole, rpcLag:
		if c.rpc == nil {
			note = "no chain: skipped"
			break
		}
		switch f.Kind {
		case rpcNulls:
			c.rpc.NullStorm()
		case rpcErrors:
			c.rpc.ErrorStorm(float64(f.Share) / 100)
		case rpcReset:
			c.rpc.ResetAll()
		case rpcLatency:
			c.rpc.SetLatency(f.Latency)
		case rpcBlackhole:
			c.rpc.Blackhole()
		case rpcLag:
			c.rpc.Lag(f.Blocks)
		}
		c.timeline.add("%v: on", f)
		hold()
		c.rpc.Heal()
		note = "healed"
	case chainReorg:
		if c.reorg == nil {
			note = "no chain: skipped"
			break
		}
		note = c.reorg(ctx, f.Blocks)
	}
	to := time.Now()
	c.timeline.window(f, from, to)
	c.timeline.add("%v: %s (lasted %s)", f, note, to.Sub(from).Round(time.Millisecond))
}

// startServer brings a backend back, a bounded number of times; the
// restore phase tries again if all of them fail.
func (c *cluster) startServer(ctx context.Context, name string, start func(context.Context) error) {
	for attempt := 1; attempt <= serverStartAttempts; attempt++ {
		startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := start(startCtx)
		cancel()
		if err == nil {
			return
		}
		c.timeline.add("%s start attempt %d failed: %v", name, attempt, err)
	}
}

// setSentinel and sentinelGone prove that a Redis restart loses its data.
func (c *cluster) setSentinel(ctx context.Context) {
	rdb := c.redisClient()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = rdb.Set(ctx, sentinelKey, "1", 0).Err()
}

func (c *cluster) sentinelGone(ctx context.Context) string {
	rdb := c.redisClient()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := rdb.Exists(ctx, sentinelKey).Result()
	switch {
	case err != nil:
		return "unknown (" + err.Error() + ")"
	case n == 0:
		return "yes"
	}
	return "NO"
}

func (c *cluster) redisClient() *redis.Client {
	opts, err := redis.ParseURL(c.redisURL)
	if err != nil {
		c.t.Errorf("redis url: %v", err)
		opts = &redis.Options{Addr: c.redis.Addr()}
	}
	return redis.NewClient(opts)
}

// restore ends every fault that might linger and waits until each
// process answers /readyz. The supervisor must be running.
func (c *cluster) restore(ctx context.Context) error {
	_ = c.pg.Resume()
	c.superviseBouncer(ctx)
	c.startServer(ctx, "postgres", c.pg.Start)
	c.startServer(ctx, "redis", c.redis.Start)
	for _, p := range c.proxies {
		p.Heal()
	}
	if c.rpc != nil {
		c.rpc.Heal()
	}
	for _, m := range c.members {
		m.mu.Lock()
		if m.held {
			m.held = false
			m.startProc()
		}
		m.mu.Unlock()
	}
	deadline := time.Now().Add(readyTimeout)
	for _, m := range c.members {
		for !ready(m.proc) {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s not ready %s after the faults stopped (last log: %s)", m.name, readyTimeout, lastLine(m.proc.Logs()))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	c.timeline.add("every fault ended; every process ready")
	return nil
}

var readyClient = &http.Client{Timeout: 3 * time.Second}

func ready(p *harness.Proc) bool {
	if !p.Running() {
		return false
	}
	resp, err := readyClient.Get(p.URL() + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func lastLine(logs string) string {
	logs = strings.TrimRight(logs, "\n")
	if i := strings.LastIndexByte(logs, '\n'); i >= 0 {
		logs = logs[i+1:]
	}
	const maxLen = 300
	if len(logs) > maxLen {
		logs = logs[:maxLen] + "…"
	}
	return logs
}

// timeline is the soak's record of what happened when, printed on
// failure; windows are the faults' real start and end times.
type timeline struct {
	start   time.Time
	mu      sync.Mutex
	entries []string
	windows []window
}

type window struct {
	fault    fault
	from, to time.Time
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

func (tl *timeline) add(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	at := time.Since(tl.start).Seconds()
	tl.entries = append(tl.entries, fmt.Sprintf("%7.2fs  %s", at, fmt.Sprintf(format, args...)))
}

func (tl *timeline) window(f fault, from, to time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.windows = append(tl.windows, window{fault: f, from: from, to: to})
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.entries, "\n")
}

func (tl *timeline) faultWindows() []window {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]window(nil), tl.windows...)
}

// restarts sums up what happened to each process.
func (c *cluster) restarts() string {
	var parts []string
	for _, m := range c.members {
		m.mu.Lock()
		parts = append(parts, fmt.Sprintf("%s killed %d, stopped by SIGTERM %d, exited on its own %d", m.name, m.kills, m.stops, m.exits))
		m.mu.Unlock()
	}
	return strings.Join(parts, ", ")
}

func (c *cluster) proxyStats() string {
	var parts []string
	for _, name := range links {
		accepted, reset := c.proxies[name].Stats()
		parts = append(parts, fmt.Sprintf("%s %d connections (%d reset)", name, accepted, reset))
	}
	return strings.Join(parts, ", ")
}

// TestBouncerSupervised: a PgBouncer that died is started again by the
// supervisor, and the pooled DSN works through it.
func TestBouncerSupervised(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, timeline: newTimeline()}
	c.bouncer = startBouncer(t, port, dsn)
	c.bouncer.Stop()
	if conn, err := net.DialTimeout("tcp", c.bouncer.Addr(), bouncerDialTimeout); err == nil {
		conn.Close()
		t.Fatal("pgbouncer still listens after Stop")
	}
	c.superviseBouncer(context.Background())
	pool, err := pgxpool.New(context.Background(), c.bouncer.URL(dbUser(t, dsn), dbName(t, dsn), bouncerExecMode))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `SELECT 1`); err != nil {
		t.Fatalf("through the restarted pgbouncer: %v\n%s", err, c.timeline)
	}
	if !strings.Contains(c.timeline.String(), "started again") {
		t.Fatalf("timeline: %s", c.timeline)
	}
}
