package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/monitor"
	"github.com/settle/settle/pkg/periodic"
	"github.com/settle/settle/pkg/postgres"
)

type monitorSettings struct {
	HotPathInterval time.Duration
	HotPathWindow   time.Duration
	HealthInterval  time.Duration
	BacklogInterval time.Duration
	BacklogTimeout  time.Duration
	// ProviderMissInterval and ProviderMissGrace: how often each
	// provider's miss count is read, and how long a provider has to report
	// a transfer before it counts as missed.
	ProviderMissInterval time.Duration
	ProviderMissGrace    time.Duration
}

func readMonitorSettings(env *config.Env) monitorSettings {
	hotPath := env.DurationWithin("HOT_PATH_CHECK_INTERVAL", monitor.HotPathIntervalDefault, intervalMin, intervalMax)
	// A run checks the balances touched within the window, so a window
	// shorter than the period leaves the gap between runs to the daily
	// full pass: unset, it covers two periods; set shorter, it is refused.
	window := env.DurationWithin("HOT_PATH_CHECK_WINDOW", min(max(postgres.HotPathWindowDefault, 2*hotPath), windowMax), intervalMin, windowMax)
	if window < hotPath {
		env.Reject("HOT_PATH_CHECK_WINDOW", fmt.Errorf("%s is shorter than HOT_PATH_CHECK_INTERVAL (%s): balances touched between two runs would go unchecked until the daily full pass", window, hotPath))
	}
	return monitorSettings{
		HotPathInterval: hotPath,
		HotPathWindow:   window,
		HealthInterval:  env.DurationWithin("HEALTH_CHECK_INTERVAL", monitor.HealthIntervalDefault, intervalMin, intervalMax),
		BacklogInterval: env.DurationWithin("BACKLOG_INTERVAL", monitor.BacklogIntervalDefault, intervalMin, intervalMax),
		BacklogTimeout:  env.DurationWithin("BACKLOG_TIMEOUT", monitor.BacklogTimeoutDefault, timeoutMin, timeoutMax),

		ProviderMissInterval: env.DurationWithin("PROVIDER_MISS_INTERVAL", monitor.ProviderMissIntervalDefault, intervalMin, intervalMax),
		ProviderMissGrace:    env.DurationWithin("PROVIDER_MISS_GRACE", monitor.ProviderMissGraceDefault, windowMin, windowMax),
	}
}

// monitoringJobs are the reconciliation and health checks and the
// backlog gauges.
func monitoringJobs(s monitorSettings, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) []periodic.Job {
	m := monitor.New(db, alerts, log, reg)
	backlog := monitor.NewBacklog(db, s.BacklogTimeout, reg)
	providers := monitor.NewProviders(db, s.ProviderMissGrace, reg)
	return []periodic.Job{
		// Every replica too: a gauge, read whichever scheduler is scraped.
		{Name: "provider_misses", Every: s.ProviderMissInterval, Local: true, Run: providers.Refresh},
		// Every replica, so none exports a stale backlog (alerts take the max).
		{Name: "backlog_gauges", Every: s.BacklogInterval, Timeout: s.BacklogTimeout + time.Second, Local: true, Run: backlog.Refresh},
		{Name: "hot_path_check", Every: s.HotPathInterval, Run: m.HotPath(s.HotPathWindow)},
		{Name: "health_check", Every: s.HealthInterval, Run: m.Health},
		{Name: "health_gauges", Every: s.HealthInterval, Local: true, Run: m.HealthGauges},
		{Name: "full_reconcile", Every: monitor.FullReconcileCheckEvery, Timeout: monitor.FullReconcileCheckEvery, Run: m.FullReconcile},
	}
}
