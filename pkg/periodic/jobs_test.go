package periodic_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/periodic"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestTwoRunnersNeverFireOnePeriodTwice races two runners (as two
// scheduler replicas would) on one database.
func TestTwoRunnersNeverFireOnePeriodTwice(t *testing.T) {
	db := testenv.DB(t)
	const every = 200 * time.Millisecond
	var mu sync.Mutex
	runs := map[time.Time][]string{}
	job := func(owner string) periodic.Job {
		return periodic.Job{Name: "tick", Every: every, Run: func(ctx context.Context) error {
			// The claimed period, not the clock at run time: a run late in
			// its period may start in the next one.
			period, ok := periodic.JobPeriod(ctx)
			require.True(t, ok)
			mu.Lock()
			runs[period] = append(runs[period], owner)
			mu.Unlock()
			return nil
		}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, owner := range []string{"a", "b"} {
		r := &periodic.Runner{Periods: db, Owner: owner, Log: zerolog.Nop()}
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx, []periodic.Job{job(owner)}) }()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(runs), 5, "the job kept running")
	for period, owners := range runs {
		require.Len(t, owners, 1, "period %s fired by %v", period, owners)
	}
}

// TestLocalJobRunsOnEveryReplica: a local job is not claimed, so each
// replica runs it every period.
func TestLocalJobRunsOnEveryReplica(t *testing.T) {
	db := testenv.DB(t)
	const every = 100 * time.Millisecond
	var mu sync.Mutex
	runs := map[string]int{}
	// Up to 20 s for three runs each (a loaded machine runs late); the
	// claim check at the end tells a local job from a claimed one.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, owner := range []string{"a", "b"} {
		job := periodic.Job{Name: "gauges", Every: every, Local: true, Run: func(context.Context) error {
			mu.Lock()
			runs[owner]++
			if runs["a"] >= 3 && runs["b"] >= 3 {
				cancel()
			}
			mu.Unlock()
			return nil
		}}
		r := &periodic.Runner{Periods: db, Owner: owner, Log: zerolog.Nop()}
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx, []periodic.Job{job}) }()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, runs["a"], 3)
	require.GreaterOrEqual(t, runs["b"], 3)
	_, claimed, err := db.ClaimPeriod(context.Background(), "gauges", every, 0, "probe")
	require.NoError(t, err)
	require.True(t, claimed, "a local job leaves no claim behind")
}

func TestDailyJobWaitsForItsTimeOfDay(t *testing.T) {
	db := testenv.DB(t)
	now := time.Now().UTC()
	sinceMidnight := now.Sub(now.Truncate(24 * time.Hour))
	ran := make(chan struct{}, 2)
	later := periodic.Job{Name: "later", Every: 24 * time.Hour, At: sinceMidnight + time.Hour, Run: func(context.Context) error { ran <- struct{}{}; return nil }}
	earlier := periodic.Job{Name: "earlier", Every: 24 * time.Hour, At: max(sinceMidnight-time.Minute, time.Nanosecond), Run: func(context.Context) error { ran <- struct{}{}; return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&periodic.Runner{Periods: db, Owner: "x", Log: zerolog.Nop()}).Run(ctx, []periodic.Job{later, earlier})
	}()
	select {
	case <-ran:
	case <-time.After(runUntilMax):
		t.Fatal("the job whose time has come did not run")
	}
	// The other's turn, were it due, comes within the same scheduling
	// pass: a while longer shows it does not.
	time.Sleep(500 * time.Millisecond)
	cancel()
	<-done
	require.Empty(t, ran, "only the job whose time has come ran")
}

// TestDueJobPassesOverIdlePeriods: a job whose Due finds nothing runs
// no period and claims none (no row in scheduler_jobs); once Due finds
// work, or cannot tell (an error), the job claims and runs as before.
func TestDueJobPassesOverIdlePeriods(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	var asked, runs atomic.Int32
	var answer atomic.Value
	answer.Store("idle")
	job := periodic.Job{Name: "due_job", Every: 50 * time.Millisecond,
		Due: func(context.Context) (bool, error) {
			asked.Add(1)
			switch answer.Load() {
			case "busy":
				return true, nil
			case "broken":
				return false, errors.New("cannot tell")
			}
			return false, nil
		},
		Run: func(context.Context) error { runs.Add(1); return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&periodic.Runner{Periods: db, Owner: "o", Log: zerolog.Nop()}).Run(ctx, []periodic.Job{job})
	}()
	defer func() { cancel(); <-done }()
	claimed := func() int {
		var n int
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM scheduler_jobs WHERE job = 'due_job'`).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return asked.Load() >= 5 }, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, runs.Load(), "ran with nothing due")
	require.Zero(t, claimed(), "claimed a period with nothing due")

	for _, a := range []string{"busy", "broken"} {
		answer.Store(a)
		before := runs.Load()
		require.Eventually(t, func() bool { return runs.Load() >= before+3 }, 10*time.Second, 10*time.Millisecond, "Due %s: the job did not run", a)
		require.Equal(t, 1, claimed())
	}
}

// runUntil runs one job on a fresh runner (a scheduler replica) until it
// has run want times, or for runUntilMax, and reports how many times it
// ran: a slow machine takes longer, it does not fail the test.
func runUntil(t *testing.T, r *periodic.Runner, every time.Duration, want int64) int64 {
	t.Helper()
	var ran atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), runUntilMax)
	defer cancel()
	r.Run(ctx, []periodic.Job{{Name: "recover_stale", Every: every, Run: func(context.Context) error {
		if ran.Add(1) >= want {
			cancel()
		}
		return nil
	}}})
	return ran.Load()
}

// runUntilMax bounds runUntil: minutes' worth of the tests' periods.
const runUntilMax = 20 * time.Second

// TestLongerIntervalStillRuns: an operator raises a job's interval
// (RECOVER_INTERVAL 2m -> 5m, say) and restarts the scheduler. The job
// keeps running once per new period: a bare period number (now/Every)
// would shrink, and every claim of it would be refused as already done.
func TestLongerIntervalStillRuns(t *testing.T) {
	db := testenv.DB(t)
	before := &periodic.Runner{Periods: db, Owner: "old-config", Log: zerolog.Nop()}
	require.Positive(t, runUntil(t, before, 100*time.Millisecond, 1), "the job runs under the old interval")

	after := &periodic.Runner{Periods: db, Owner: "new-config", Log: zerolog.Nop()}
	require.Positive(t, runUntil(t, after, 250*time.Millisecond, 1),
		"after the interval was raised the job never ran again (its periods are refused as already claimed)")
}

// TestClockAheadDoesNotStopJobs: a replica whose clock runs an hour fast
// still claims the database's current period, not one an hour ahead that
// would make every replica refuse each real period until then.
func TestClockAheadDoesNotStopJobs(t *testing.T) {
	db := testenv.DB(t)
	const every = 200 * time.Millisecond
	fast := &periodic.Runner{Periods: db, Owner: "fast-clock", Log: zerolog.Nop()}
	periodic.SetClock(fast, func() time.Time { return time.Now().Add(time.Hour) })
	require.Positive(t, runUntil(t, fast, every, 1), "the fast replica runs the database's periods")

	right := &periodic.Runner{Periods: db, Owner: "right-clock", Log: zerolog.Nop()}
	require.Positive(t, runUntil(t, right, every, 1), "no period ran for the hour after a replica's clock ran fast")
}

// TestClockBehindStillRunsEachPeriod: a replica whose clock lags the
// database's by an hour still runs the job each period (the database's),
// instead of waiting an hour for its own clock to reach a period it ran.
func TestClockBehindStillRunsEachPeriod(t *testing.T) {
	db := testenv.DB(t)
	slow := &periodic.Runner{Periods: db, Owner: "slow-clock", Log: zerolog.Nop()}
	periodic.SetClock(slow, func() time.Time { return time.Now().Add(-time.Hour) })
	require.GreaterOrEqual(t, runUntil(t, slow, 200*time.Millisecond, 3), int64(3))
}

// claimFailures counts the runner's "could not claim" warnings.
type claimFailures struct{ n atomic.Int32 }

func (c *claimFailures) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "could not claim job period") {
		c.n.Add(1)
	}
	return len(p), nil
}

// TestClaimOnAFrozenDatabaseEnds: a PostgreSQL that stops answering
// mid-claim without a reset (a failover, a partition) fails the claim at
// its bound and the job's loop tries again, instead of waiting until the
// kernel gives the socket up; once PostgreSQL is back, the job runs.
func TestClaimOnAFrozenDatabaseEnds(t *testing.T) {
	freezer, dsn := testenv.NewFreezer(t, testenv.DatabaseURL(t))
	db := testenv.OpenDB(t, dsn)
	var failures claimFailures
	r := &periodic.Runner{Periods: db, Owner: "o", Log: zerolog.New(&failures)}
	const bound = 100 * time.Millisecond
	periodic.SetClaimTimeout(r, bound)
	var runs atomic.Int32
	job := periodic.Job{Name: "frozen", Every: 50 * time.Millisecond, Run: func(context.Context) error { runs.Add(1); return nil }}

	freezer.Freeze()
	defer freezer.Thaw() // before the pool's Close, which waits for the claim
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx, []periodic.Job{job})
	}()
	defer func() { freezer.Thaw(); cancel(); <-done }()
	require.Eventually(t, func() bool { return failures.n.Load() >= 2 }, 30*bound, 10*time.Millisecond,
		"the job's claim still waits on a frozen PostgreSQL (its bound is %s)", bound)
	require.Zero(t, runs.Load())
	freezer.Thaw()
	require.Eventually(t, func() bool { return runs.Load() > 0 }, 5*time.Second, 10*time.Millisecond, "the job did not run once PostgreSQL was back")
}
