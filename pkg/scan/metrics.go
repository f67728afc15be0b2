package scan

import "github.com/prometheus/client_golang/prometheus"

// Label values of settle_scan_deposits_total's source: the scanner stored
// the transfer first (no webhook had reported it: the providers' miss
// rate), or a webhook (or an earlier scan) already had.
const (
	SourceScanner  = "scanner"
	SourceReported = "reported"
	// SourceConflict: the event id holds other content; a human looks.
	SourceConflict = "conflict"
	// SourceSuperseded: the id held a deposit the chain had contradicted
	// (failed/mismatch), which now has the scanned content.
	SourceSuperseded = "superseded"
	// SourceReopened: the id held this deposit, failed/reorged or
	// credited and compensated; found again on the chain, it was reopened
	// or is watched again to be given back.
	SourceReopened = "reopened"
)

// Label values of the passes' result.
const (
	resultOK        = "ok"
	resultIdle      = "idle"    // nothing new at or below the finality head
	resultSkipped   = "skipped" // another scheduler holds the lease
	resultLeaseLost = "lease_lost"
	resultError     = "error"
	// resultRestarted: a rescan pass found the branch changed under its
	// job since the job's pass before, and sent the job back (restartRescan).
	resultRestarted = "restarted"
)

// Kinds of pass.
const (
	kindCursor = "cursor"
	kindRescan = "rescan"
)

type metrics struct {
	lag *prometheus.GaugeVec
	// lagUpdated: when lag was last set. A replica that stops reading the
	// network (its node fails, its loop is stuck) keeps its last lag; the
	// alerts count only lags set recently.
	lagUpdated  *prometheus.GaugeVec
	deposits    *prometheus.CounterVec
	passes      *prometheus.CounterVec
	calls       *prometheus.CounterVec
	blocks      *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	logsRefused *prometheus.CounterVec
	reorgs      *prometheus.CounterVec
	// rescansWaiting: running jobs whose next block is above the finality head.
	rescansWaiting *prometheus.GaugeVec
	// interval and passTimeout: the settings, so the alerts size how long
	// a healthy replica may go between passes from them.
	interval    *prometheus.GaugeVec
	passTimeout *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_head_lag_blocks", Help: "Blocks at or below the network's finality head that the scanner's cursor has not scanned yet.",
		}, []string{"network"}),
		lagUpdated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_lag_updated_timestamp_seconds", Help: "Unix time this process last set settle_scan_head_lag_blocks of the network (each pass that read the finality head and the cursor, whichever replica holds the lease).",
		}, []string{"network"}),
		deposits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_deposits_total", Help: "Deposits the chain scanner found, by source: scanner (stored first, no webhook had reported it), reported (already an event), reopened (already an event that ended failed/reorged, now reopened), superseded (replaced a failed/mismatch deposit), conflict (the id holds other content).",
		}, []string{"network", "source"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_passes_total", Help: "Scanner passes, by kind (cursor, rescan) and result (ok, idle, skipped, lease_lost, error, restarted: a rescan pass found the branch changed under its job and read its range again).",
		}, []string{"network", "kind", "result"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_rpc_calls_total", Help: "JSON-RPC calls the scanner made (each call of a batch counted), by method.",
		}, []string{"network", "method"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_blocks_total", Help: "Blocks the scanner read, by kind (cursor, rescan).",
		}, []string{"network", "kind"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_last_success_timestamp_seconds", Help: "Unix time of this process's last cursor pass that succeeded (ok or idle).",
		}, []string{"network"}),
		logsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_logs_refused_total", Help: "eth_getLogs answers refused as too large (the provider's result or range limit, or SCAN_LOGS_MAX), each asked again over half the blocks.",
		}, []string{"network"}),
		reorgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_scan_reorgs_below_cursor_total", Help: "Cursor passes that found the block below their range replaced by a reorg deeper than the finality policy, each asking for a rescan of the blocks below (SCAN_REORG_RESCAN).",
		}, []string{"network"}),
		rescansWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_rescans_waiting", Help: "Running rescan and backfill jobs whose next block is above the network's finality head as the scanner last read it: they wait for the chain (a range asked above the head waits until the chain gets there; settlectl rescan cancel ends one).",
		}, []string{"network"}),
		interval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_interval_seconds", Help: "SCAN_INTERVAL of this process's scanner, for each network it scans: how often it passes.",
		}, []string{"network"}),
		passTimeout: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_scan_pass_timeout_seconds", Help: "SCAN_PASS_TIMEOUT of this process's scanner, for each network it scans: the bound of one pass (and of each statement between passes).",
		}, []string{"network"}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.lagUpdated, m.deposits, m.passes, m.calls, m.blocks, m.lastSuccess, m.logsRefused, m.reorgs, m.rescansWaiting,
			m.interval, m.passTimeout)
	}
	return m
}
