package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/queue"
)

// monitoringJobs are the reconciliation and health checks.
func monitoringJobs(db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) []queue.Job {
	return nil
}
