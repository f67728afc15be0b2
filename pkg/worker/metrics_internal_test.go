package worker

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestAlertedSeriesStartAtZero: the series SettleTaskRetryRatioHigh and
// SettleEventLatencySLO rate() exist at 0 in a new worker, so what the
// first scrape would have shown is counted as an increase.
func TestAlertedSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newWorkerMetrics(reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, p := range m.GetLabel() {
				key += "/" + p.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				got[key] = float64(h.GetSampleCount())
			} else {
				got[key] = m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, map[string]float64{
		"settle_tasks_total/success/payment:apply": 0,
		"settle_task_retries_total":                0,
		"settle_event_latency_seconds/chain":       0,
		"settle_event_latency_seconds/trusted":     0,
	}, got)
}
