package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/monitor"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/queue"
)

type monitorSettings struct {
	HotPathInterval time.Duration
	HotPathWindow   time.Duration
	HealthInterval  time.Duration
}

func readMonitorSettings(env *config.Env) monitorSettings {
	return monitorSettings{
		HotPathInterval: env.Duration("HOT_PATH_CHECK_INTERVAL", monitor.HotPathIntervalDefault),
		HotPathWindow:   env.Duration("HOT_PATH_CHECK_WINDOW", postgres.HotPathWindowDefault),
		HealthInterval:  env.Duration("HEALTH_CHECK_INTERVAL", monitor.HealthIntervalDefault),
	}
}

// monitoringJobs are the reconciliation and health checks.
func monitoringJobs(s monitorSettings, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) []queue.Job {
	m := monitor.New(db, alerts, log, reg)
	return []queue.Job{
		{Name: "hot_path_check", Every: s.HotPathInterval, Run: m.HotPath(s.HotPathWindow)},
		{Name: "health_check", Every: s.HealthInterval, Run: m.Health},
		{Name: "health_gauges", Every: s.HealthInterval, Local: true, Run: m.HealthGauges},
		{Name: "full_reconcile", Every: monitor.FullReconcileCheckEvery, Timeout: monitor.FullReconcileCheckEvery, Run: m.FullReconcile},
	}
}
