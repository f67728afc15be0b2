package outbox_test

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestAsynqQueueMetrics: asynq's queue collector (x/metrics, pinned beside
// asynq v0.26.0) reads this asynq's queues through the scheduler's client.
func TestAsynqQueueMetrics(t *testing.T) {
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	client := asynq.NewClientFromRedisClient(rdb)
	for range 3 {
		_, err := client.Enqueue(asynq.NewTask("test:noop", nil), asynq.Queue("payments"))
		require.NoError(t, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(outbox.QueueMetricsCollector(asynq.NewInspectorFromRedisClient(rdb)))
	families, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["queue"] != "payments" {
				continue
			}
			switch f.GetName() {
			case "asynq_queue_size":
				byName[f.GetName()] = m.GetGauge().GetValue()
			case "asynq_tasks_enqueued_total":
				if labels["state"] == "pending" {
					byName[f.GetName()+"/pending"] = m.GetGauge().GetValue()
				}
			}
		}
	}
	require.Equal(t, map[string]float64{"asynq_queue_size": 3, "asynq_tasks_enqueued_total/pending": 3}, byName)
}

// TestQueueDepthMaxExported: the enqueuer exports QUEUE_DEPTH_MAX, the
// bound SettleQueueDepthHigh takes its threshold from (the default where
// unset).
func TestQueueDepthMaxExported(t *testing.T) {
	for _, tc := range []struct{ set, want int }{{200, 200}, {0, outbox.QueueDepthMaxDefault}} {
		reg := prometheus.NewRegistry()
		outbox.NewEnqueuer(outbox.EnqueuerOptions{DepthMax: tc.set, Registerer: reg})
		families, err := reg.Gather()
		require.NoError(t, err)
		var got float64
		for _, f := range families {
			if f.GetName() == "settle_queue_depth_max" {
				got = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		require.Equal(t, float64(tc.want), got, "DepthMax %d", tc.set)
	}
}
