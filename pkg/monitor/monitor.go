// Package monitor is what lets an operator sleep: the hot-path balance
// check, the full historical reconciliation, and the zombie and health
// alerts, run by the scheduler and counted in metrics.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/postgres"
)

// Cadences and bounds of the seed.
const (
	HotPathIntervalDefault   = time.Minute
	FullReconcileEvery       = 24 * time.Hour
	FullReconcileCheckEvery  = time.Hour
	FullReconcileChunksMax   = 10_000
	HealthIntervalDefault    = time.Minute
	mismatchesAlertSampleMax = 5
	// fullReportTimeout bounds reporting a full pass's mismatches.
	fullReportTimeout = 10 * time.Second
)

// Kinds are the reconciliations, the kind label of settle_reconcile_*.
var Kinds = []string{"hot_path", "full"}

// Store is the database side.
type Store interface {
	HotPathCheck(ctx context.Context, window time.Duration) (int, []postgres.Mismatch, error)
	ReconcileFull(ctx context.Context, every time.Duration, chunk, maxChunks int) (postgres.ReconcilePass, error)
	ReportMismatches(ctx context.Context, report func([]postgres.UnreportedMismatches)) error
	Health(ctx context.Context) (postgres.Health, error)
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// Monitor holds the checks and their metrics.
type Monitor struct {
	store  Store
	alerts Alerter
	log    zerolog.Logger

	runs       *prometheus.CounterVec
	mismatches *prometheus.CounterVec
	// lastFound lets SettleReconcileMismatch hold between runs longer
	// apart than its counter's window (HOT_PATH_CHECK_INTERVAL).
	lastFound *prometheus.GaugeVec
	checked   *prometheus.CounterVec
	zombies   *prometheus.GaugeVec
}

// New builds a monitor; reg may be nil.
func New(store Store, alerts Alerter, log zerolog.Logger, reg prometheus.Registerer) *Monitor {
	m := &Monitor{
		store: store, alerts: alerts, log: log,
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_reconcile_runs_total", Help: "Reconciliation runs by kind (hot_path, full).",
		}, []string{"kind"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_reconcile_mismatches_total", Help: "Balances found differing from initial_balance + SUM(journal), by kind.",
		}, []string{"kind"}),
		lastFound: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_reconcile_mismatch_timestamp_seconds", Help: "When a run on this replica last counted balances differing from their journal, by kind.",
		}, []string{"kind"}),
		checked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_reconcile_balances_checked_total", Help: "Balances compared with their journal, by kind.",
		}, []string{"kind"}),
		zombies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_zombie_events", Help: "Events stuck past their bound at the last health check, by status; also DLQ counts.",
		}, []string{"status"}),
	}
	if reg != nil {
		reg.MustRegister(m.runs, m.mismatches, m.lastFound, m.checked, m.zombies)
	}
	// Each kind's series exists at 0 from the start: increase() in the
	// alerts cannot see a series that first appears at its first count.
	for _, kind := range Kinds {
		m.runs.WithLabelValues(kind)
		m.mismatches.WithLabelValues(kind)
		m.checked.WithLabelValues(kind)
	}
	return m
}

// HotPath compares the balances touched in the last window with their
// journal; any difference is a critical alert.
func (m *Monitor) HotPath(window time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		checked, bad, err := m.store.HotPathCheck(ctx, window)
		if err != nil {
			return err
		}
		m.runs.WithLabelValues("hot_path").Inc()
		m.checked.WithLabelValues("hot_path").Add(float64(checked))
		m.reportMismatches("hot_path", bad)
		return nil
	}
}

// FullReconcile advances the daily pass over every balance; it resumes an
// interrupted pass and starts a new one once the last is a day old. Then
// it counts and alerts on every pass's mismatches not reported yet:
// those it recorded, and those settlectl reconcile recorded (it prints
// them only), in a chunk this run was overtaken on or in a pass it never
// saw.
func (m *Monitor) FullReconcile(ctx context.Context) error {
	pass, err := m.store.ReconcileFull(ctx, FullReconcileEvery, postgres.ReconcileChunkDefault, FullReconcileChunksMax)
	if errors.Is(err, postgres.ErrNothingToReconcile) {
		pass, err = postgres.ReconcilePass{}, nil
	} else {
		// Checked: only the chunks this run recorded.
		m.checked.WithLabelValues("full").Add(float64(pass.Checked))
		m.logMismatches("full", pass.Found)
	}
	if err == nil && pass.Overtaken > 0 {
		m.log.Info().Int64("pass", pass.ID).Int("chunks", pass.Overtaken).
			Msg("full reconciliation: another run of the pass recorded some chunks first; not counted here")
	}
	if err == nil && pass.Finished {
		m.runs.WithLabelValues("full").Inc()
		m.log.Info().Int64("pass", pass.ID).Int64("checked", pass.Checked).Int64("mismatches", pass.Mismatches).
			Bool("resumed", pass.Resumed).Msg("full reconciliation finished")
	}
	// A context of its own: a run cut at its timeout still reports what it
	// recorded.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fullReportTimeout)
	defer cancel()
	rerr := m.store.ReportMismatches(rctx, m.reportFull)
	return errors.Join(err, rerr)
}

// reportFull counts and alerts on the passes' unreported mismatches once,
// whichever run recorded them; this run's own were logged one by one.
// Each pass's stored sample is of the mismatches reported now.
func (m *Monitor) reportFull(unreported []postgres.UnreportedMismatches) {
	var total int64
	passes := make([]int64, 0, len(unreported))
	sample := make([]string, 0, mismatchesAlertSampleMax)
	for _, u := range unreported {
		total += u.Mismatches
		passes = append(passes, u.Pass)
		if u.Sample != "" {
			sample = append(sample, strings.Split(u.Sample, "; ")...)
		}
		m.log.Error().Str("severity", "CRITICAL").Int64("pass", u.Pass).Int64("mismatches", u.Mismatches).Str("sample", u.Sample).
			Msg("full reconciliation: balances do not match their journal (settlectl reconcile lists them)")
	}
	m.mismatches.WithLabelValues("full").Add(float64(total))
	if total > 0 {
		m.lastFound.WithLabelValues("full").SetToCurrentTime()
	}
	if len(sample) > mismatchesAlertSampleMax {
		sample = sample[:mismatchesAlertSampleMax]
	}
	m.alerts.Raise("reconcile_mismatch:full", alert.Critical, fmt.Sprintf("%d balance(s) differ from initial_balance + journal", total),
		map[string]any{"kind": "full", "sample": sample, "passes": passes})
}

func (m *Monitor) reportMismatches(kind string, bad []postgres.Mismatch) {
	if len(bad) == 0 {
		return
	}
	m.mismatches.WithLabelValues(kind).Add(float64(len(bad)))
	m.lastFound.WithLabelValues(kind).SetToCurrentTime()
	sample := make([]string, 0, mismatchesAlertSampleMax)
	for i, b := range bad {
		if i < mismatchesAlertSampleMax {
			sample = append(sample, b.String())
		}
	}
	m.logMismatches(kind, bad)
	m.alerts.Raise("reconcile_mismatch:"+kind, alert.Critical, fmt.Sprintf("%d balance(s) differ from initial_balance + journal", len(bad)),
		map[string]any{"kind": kind, "sample": sample})
}

func (m *Monitor) logMismatches(kind string, bad []postgres.Mismatch) {
	for _, b := range bad {
		m.log.Error().Str("severity", "CRITICAL").Int64("user_id", b.UserID).Str("asset", b.Asset).
			Str("balance", b.Balance.String()).Str("initial_balance", b.Initial.String()).Str("journal", b.Journal.String()).
			Str("kind", kind).Msg("balance does not match its journal")
	}
}

// HealthGauges refreshes the zombie and DLQ gauges only. It runs on every
// scheduler replica (Health, which alerts, runs on one per period), so no
// replica exports a count older than the health interval.
func (m *Monitor) HealthGauges(ctx context.Context) error {
	h, err := m.store.Health(ctx)
	if err != nil {
		return err
	}
	m.setGauges(h)
	return nil
}

// Health counts zombies and DLQ activity and alerts on each past its bound.
func (m *Monitor) Health(ctx context.Context) error {
	h, err := m.store.Health(ctx)
	if err != nil {
		return err
	}
	m.setGauges(h)
	check := func(key string, n int64, bound int64, summary string) {
		if n > bound {
			m.alerts.Raise(key, alert.Critical, summary, map[string]any{"count": n})
		}
	}
	check("zombie_processing", h.StuckProcessing, 0, "events stuck in processing for over 5 minutes")
	check("zombie_pending", h.StuckPending, 0, "events pending for over 15 minutes: is the scheduler running?")
	check("zombie_enqueued", h.StuckEnqueued, 0, "events enqueued for over 15 minutes: are the workers running?")
	check("zombie_awaiting_finality", h.StuckAwaiting, 0, "deposits overdue for their finality re-check")
	check("dlq_flood", h.DeadLettersLastHour, postgres.DeadLettersHourlyMax, "more than 10 dead letters in the last hour")
	check("processed_events_pending", h.PendingKeys, 0, "idempotency records stuck pending for over 10 minutes")
	return nil
}

func (m *Monitor) setGauges(h postgres.Health) {
	gauges := map[string]int64{
		"processing":        h.StuckProcessing,
		"pending":           h.StuckPending,
		"enqueued":          h.StuckEnqueued,
		"awaiting_finality": h.StuckAwaiting,
		"dlq_last_hour":     h.DeadLettersLastHour,
		"dlq_open":          h.OpenDeadLetters,
		"processed_pending": h.PendingKeys,
	}
	for status, n := range gauges {
		m.zombies.WithLabelValues(status).Set(float64(n))
	}
}
