package notify_test

import (
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/notify"
)

// TestResultSeriesStartAtZero: a new deliverer exports every result at
// 0, so SettleNotificationsUndeliverable's increase() sees the first
// notification given up.
func TestResultSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	notify.New(nil, "http://receiver.invalid/", testKey, zerolog.New(io.Discard), nil, reg)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{
		"settle_notifications_total/delivered": 0,
		"settle_notifications_total/retry":     0,
		"settle_notifications_total/failed":    0,
	}, got)
}
