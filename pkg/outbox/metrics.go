package outbox

import (
	"github.com/hibiken/asynq"
	asynqmetrics "github.com/hibiken/asynq/x/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// QueueMetricsCollector is asynq's own queue collector (asynq_queue_size,
// asynq_queue_latency_seconds, asynq_tasks_enqueued_total{state}, ...),
// which asynqmon's Metrics tab reads back from Prometheus. It asks Redis at
// each scrape; when Redis does not answer it exports nothing (and asynq
// logs the error through the standard logger).
func QueueMetricsCollector(inspector *asynq.Inspector) prometheus.Collector {
	return asynqmetrics.NewQueueMetricsCollector(inspector)
}
