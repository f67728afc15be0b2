package dlq_test

import (
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/dlq"
)

// TestWriteSeriesStartAtZero: a new sink exports every sink's count at
// 0, so the DLQ alerts' increase() sees a process's first letter to each.
func TestWriteSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	dlq.NewSink(nil, nil, zerolog.New(io.Discard), reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "settle_dlq_writes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{"postgres": 0, "redis": 0, "log": 0}, got)
}
