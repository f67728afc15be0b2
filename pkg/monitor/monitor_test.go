package monitor_test

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/monitor"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type alerts struct {
	mu   sync.Mutex
	keys []string
}

func (a *alerts) Raise(key string, _ alert.Severity, _ string, _ map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, key)
}

func (a *alerts) has(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range a.keys {
		if k == key {
			return true
		}
	}
	return false
}

func credit(t *testing.T, db *postgres.DB, id string, user int64, amount string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: decimal.RequireFromString(amount)}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{})
	require.NoError(t, err)
}

func TestHotPathCatchesATamperedBalanceInOneRun(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for _, u := range []int64{1, 2} {
		_, err := db.CreateUser(ctx, u)
		require.NoError(t, err)
	}
	credit(t, db, "a", 1, "5")
	credit(t, db, "b", 2, "7")
	a := &alerts{}
	reg := prometheus.NewRegistry()
	m := monitor.New(db, a, zerolog.New(io.Discard), reg)
	run := m.HotPath(postgres.HotPathWindowDefault)
	require.NoError(t, run(ctx))
	require.False(t, a.has("reconcile_mismatch:hot_path"), "clean books raise nothing")
	require.Zero(t, lastMismatch(t, reg, "hot_path"), "clean books set no mismatch time")

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 1000 WHERE user_id = 2`)
	require.NoError(t, err)
	checked, bad, err := db.HotPathCheck(ctx, postgres.HotPathWindowDefault)
	require.NoError(t, err)
	require.Equal(t, 2, checked)
	require.Len(t, bad, 1)
	require.Equal(t, int64(2), bad[0].UserID)
	before := time.Now()
	require.NoError(t, run(ctx))
	require.True(t, a.has("reconcile_mismatch:hot_path"))
	// SettleReconcileMismatch holds a period and a run from this time.
	require.GreaterOrEqual(t, lastMismatch(t, reg, "hot_path"), float64(before.Unix()))
}

// lastMismatch is settle_reconcile_mismatch_timestamp_seconds{kind}, 0
// where it is not exported.
func lastMismatch(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "settle_reconcile_mismatch_timestamp_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == kind {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func TestHotPathSeesATamperOnAnIdleBalance(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "USDC", decimal.RequireFromString("3")))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// No journal row at all in the window, but the row itself was changed.
	_, err = conn.Exec(ctx, `UPDATE balances SET updated_at = now() - interval '1 day', balance = 3`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 4`)
	require.NoError(t, err)
	_, bad, err := db.HotPathCheck(ctx, postgres.HotPathWindowDefault)
	require.NoError(t, err)
	require.Len(t, bad, 1, "the balances trigger stamps updated_at whoever writes")
}

func TestFullReconciliationIsBoundedAndResumable(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for u := int64(1); u <= 25; u++ {
		_, err := db.CreateUser(ctx, u)
		require.NoError(t, err)
		require.NoError(t, db.SetInitialBalance(ctx, u, "ETH", decimal.RequireFromString("1")))
	}
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 2 WHERE user_id IN (3, 21)`)
	require.NoError(t, err)

	// Two chunks of 10, then stop: the pass is open with its cursor saved.
	first, err := db.ReconcileFull(ctx, monitor.FullReconcileEvery, 10, 2)
	require.NoError(t, err)
	require.False(t, first.Finished)
	require.EqualValues(t, 20, first.Checked)
	require.EqualValues(t, 1, first.Mismatches)

	second, err := db.ReconcileFull(ctx, monitor.FullReconcileEvery, 10, 100)
	require.NoError(t, err)
	require.True(t, second.Resumed)
	require.True(t, second.Finished)
	require.Equal(t, first.ID, second.ID)
	require.EqualValues(t, 5, second.Checked, "resumed after the cursor")
	require.EqualValues(t, 1, second.Mismatches)
	require.Equal(t, int64(21), second.Found[0].UserID)

	_, err = db.ReconcileFull(ctx, monitor.FullReconcileEvery, 10, 100)
	require.ErrorIs(t, err, postgres.ErrNothingToReconcile, "a finished pass is not repeated within the day")
	var total int
	require.NoError(t, conn.QueryRow(ctx, `SELECT mismatches FROM reconcile_runs WHERE id = $1`, first.ID).Scan(&total))
	require.Equal(t, 2, total)
}

func TestHealthAlertsOnZombies(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "old", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1")}})
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE payment_events SET created_at = now() - interval '1 hour', updated_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	a := &alerts{}
	require.NoError(t, monitor.New(db, a, zerolog.New(io.Discard), nil).Health(ctx))
	require.True(t, a.has("zombie_pending"))
	require.False(t, a.has("zombie_enqueued"))

	// Another replica only refreshes its gauges: the same count, no alert.
	reg := prometheus.NewRegistry()
	other := &alerts{}
	require.NoError(t, monitor.New(db, other, zerolog.New(io.Discard), reg).HealthGauges(ctx))
	require.Empty(t, other.keys)
	require.Equal(t, 1.0, gaugeValue(t, reg, "settle_zombie_events", "pending"))
	require.Equal(t, 0.0, gaugeValue(t, reg, "settle_zombie_events", "enqueued"))
}

// TestHealthCountsPendingFromTheRequeue: an old event stale recovery has
// just sent back to the outbox is not stuck pending; it became pending a
// moment ago and the enqueuer's next claim takes it. Counted from its
// created_at, a health check between the requeue and that claim raised
// zombie_pending ("is the scheduler running?") and set the gauge.
func TestHealthCountsPendingFromTheRequeue(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "lost", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1")}})
	require.NoError(t, err)
	_, err = db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE payment_events SET created_at = now() - interval '1 hour', updated_at = now() - interval '20 minutes'`)
	require.NoError(t, err)
	report, err := db.RecoverStale(ctx, 3*time.Minute, 10, postgres.StaleCursor{}, func(context.Context, postgres.StaleEvent) (postgres.RecoveryAction, string) {
		return postgres.RecoveryRequeue, ""
	})
	require.NoError(t, err)
	require.Equal(t, 1, report.Requeued)

	a := &alerts{}
	reg := prometheus.NewRegistry()
	require.NoError(t, monitor.New(db, a, zerolog.New(io.Discard), reg).Health(ctx))
	require.False(t, a.has("zombie_pending"), "an event requeued a moment ago was reported stuck pending")
	require.Equal(t, 0.0, gaugeValue(t, reg, "settle_zombie_events", "pending"))
}

// gaugeValue reads one labelled gauge from a registry.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, status string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "status" && l.GetValue() == status {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{status=%q}", name, status)
	return 0
}

// Two replicas' runs of the full reconciliation on one pass, each on its own
// pool, both reading the same chunk before either records it: each balance,
// mismatch and the pass's end count once, in the pass row and in the sum of
// the replicas' counters.
func TestConcurrentFullReconcilesCountEachFindingOnce(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	setup := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for u := int64(1); u <= 25; u++ {
		_, err := setup.CreateUser(ctx, u)
		require.NoError(t, err)
		require.NoError(t, setup.SetInitialBalance(ctx, u, "ETH", decimal.RequireFromString("1")))
	}
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 2 WHERE user_id IN (3, 21)`)
	require.NoError(t, err)

	// Hold both runs at their first chunk's read, so they read the same one.
	lock, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `LOCK TABLE balances IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	errs := make(chan error, len(regs))
	for _, reg := range regs {
		m := monitor.New(testenv.OpenDB(t, dsn), &alerts{}, zerolog.New(io.Discard), reg)
		go func() { errs <- m.FullReconcile(ctx) }()
	}
	watch, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer watch.Close(ctx)
	require.Eventually(t, func() bool {
		var waiting int
		err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = 'balances'::regclass AND NOT granted`).Scan(&waiting)
		return err == nil && waiting == 2
	}, 10*time.Second, 20*time.Millisecond, "both runs wait at their first chunk")
	require.NoError(t, lock.Commit(ctx))
	for range regs {
		require.NoError(t, <-errs)
	}

	var passes, checked, mismatches int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), COALESCE(sum(checked), 0), COALESCE(sum(mismatches), 0) FROM reconcile_runs`).Scan(&passes, &checked, &mismatches))
	require.EqualValues(t, 1, passes, "the second run joins the first's pass")
	require.EqualValues(t, 25, checked)
	require.EqualValues(t, 2, mismatches)

	sum := func(name string) float64 {
		var total float64
		for _, reg := range regs {
			families, err := reg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				if f.GetName() != name {
					continue
				}
				for _, s := range f.GetMetric() {
					total += s.GetCounter().GetValue()
				}
			}
		}
		return total
	}
	require.EqualValues(t, 2, sum("settle_reconcile_mismatches_total"))
	require.EqualValues(t, 25, sum("settle_reconcile_balances_checked_total"))
	require.EqualValues(t, 1, sum("settle_reconcile_runs_total"))
}

// counterSum is a counter's total over its labels in one registry; none
// is 0.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var total float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func (a *alerts) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, k := range a.keys {
		if k == key {
			n++
		}
	}
	return n
}

// waitLocked waits until n backends wait for a lock running a statement
// that contains text.
func waitLocked(t *testing.T, conn *pgx.Conn, text string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, text).Scan(&waiting)
		return err == nil && waiting == n
	}, 10*time.Second, 20*time.Millisecond, "%d backends wait at %q", n, text)
}

// TestOvertakenFullReconcileAlertsOnSettlectlsMismatch: settlectl
// reconcile starts a pass, the scheduler resumes it, both read the chunk
// with a mismatch and settlectl records it first. settlectl only prints
// it; the scheduler, overtaken, dropped the chunk's findings as another
// replica's to alert on, so the mismatch paged nobody. It pages once:
// one alert and one count, not again on the next run.
func TestOvertakenFullReconcileAlertsOnSettlectlsMismatch(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	setup := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for u := int64(1); u <= 25; u++ {
		_, err := setup.CreateUser(ctx, u)
		require.NoError(t, err)
		require.NoError(t, setup.SetInitialBalance(ctx, u, "ETH", decimal.RequireFromString("1")))
	}
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 2 WHERE user_id = 3`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer watch.Close(ctx)

	// settlectl opens its pass and waits to read the first chunk.
	balances, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = balances.Exec(ctx, `LOCK TABLE balances IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	type result struct {
		pass postgres.ReconcilePass
		err  error
	}
	settlectl, cli := make(chan result, 1), testenv.OpenDB(t, dsn)
	go func() {
		pass, err := cli.ReconcileFull(ctx, 0, postgres.ReconcileChunkDefault, 1<<30)
		settlectl <- result{pass, err}
	}()
	waitLocked(t, watch, "FROM balances b", 1)

	// Hold the pass's row: settlectl reads the chunk and waits to record
	// it, then the scheduler resumes the pass, reads the same chunk and
	// waits behind settlectl.
	row, err := watch.Begin(ctx)
	require.NoError(t, err)
	_, err = row.Exec(ctx, `SELECT 1 FROM reconcile_runs FOR UPDATE`)
	require.NoError(t, err)
	require.NoError(t, balances.Commit(ctx))
	waitLocked(t, conn, "UPDATE reconcile_runs", 1)
	a, reg, logs := &alerts{}, prometheus.NewRegistry(), &bytes.Buffer{}
	m := monitor.New(testenv.OpenDB(t, dsn), a, zerolog.New(logs), reg)
	scheduler := make(chan error, 1)
	go func() { scheduler <- m.FullReconcile(ctx) }()
	waitLocked(t, conn, "UPDATE reconcile_runs", 2)
	require.NoError(t, row.Commit(ctx))

	got := <-settlectl
	require.NoError(t, got.err)
	require.True(t, got.pass.Finished, "settlectl recorded the chunk")
	require.EqualValues(t, 1, got.pass.Mismatches)
	require.NoError(t, <-scheduler)
	require.Contains(t, logs.String(), "another run of the pass recorded some chunks first", "the scheduler was overtaken")
	require.Zero(t, counterSum(t, reg, "settle_reconcile_balances_checked_total"), "the scheduler recorded nothing")
	require.Equal(t, 1, a.count("reconcile_mismatch:full"), "the mismatch settlectl recorded reached no alert")
	require.Equal(t, 1.0, counterSum(t, reg, "settle_reconcile_mismatches_total"))

	require.NoError(t, m.FullReconcile(ctx))
	require.Equal(t, 1, a.count("reconcile_mismatch:full"), "reported again")
	require.Equal(t, 1.0, counterSum(t, reg, "settle_reconcile_mismatches_total"))
}

// TestSettlectlPassAlonePagesOnce: a pass settlectl reconcile ran start
// to end with a mismatch, the scheduler reading none of it: its next run
// (nothing to reconcile within the day) counts and alerts on it, once.
func TestSettlectlPassAlonePagesOnce(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	for u := int64(1); u <= 3; u++ {
		_, err := db.CreateUser(ctx, u)
		require.NoError(t, err)
		require.NoError(t, db.SetInitialBalance(ctx, u, "ETH", decimal.RequireFromString("1")))
	}
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE balances SET balance = 2 WHERE user_id IN (1, 3)`)
	require.NoError(t, err)
	pass, err := db.ReconcileFull(ctx, 0, postgres.ReconcileChunkDefault, 1<<30)
	require.NoError(t, err)
	require.True(t, pass.Finished)

	a, reg := &alerts{}, prometheus.NewRegistry()
	m := monitor.New(db, a, zerolog.New(io.Discard), reg)
	for range 2 {
		require.NoError(t, m.FullReconcile(ctx))
		require.Equal(t, 1, a.count("reconcile_mismatch:full"), "settlectl's mismatches paged nobody, or twice")
		require.Equal(t, 2.0, counterSum(t, reg, "settle_reconcile_mismatches_total"))
		require.Zero(t, counterSum(t, reg, "settle_reconcile_runs_total"), "settlectl's pass is not the scheduler's run")
	}
}

// TestFreshMonitorExportsZeroSeries: a new Monitor exports every kind's
// counters at 0, before any run, so the first mismatch is an increase
// SettleReconcileMismatch sees (a series first scraped at n is not).
func TestFreshMonitorExportsZeroSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	monitor.New(nil, &alerts{}, zerolog.New(io.Discard), reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					got[f.GetName()+"/"+l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{}
	for _, name := range []string{"settle_reconcile_mismatches_total", "settle_reconcile_runs_total", "settle_reconcile_balances_checked_total"} {
		for _, kind := range []string{"full", "hot_path"} {
			want[name+"/"+kind] = 0
		}
	}
	require.Equal(t, want, got)
}
