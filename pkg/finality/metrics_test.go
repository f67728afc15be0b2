package finality_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/finality"
)

// TestUntracedSeriesStartAtZero: a new gate exports the untraced counts
// (and the reorged payouts) of every network it asks at 0, so
// SettleInternalDepositsUntraced's (and SettlePayoutReorged's) increase()
// sees a worker's first one.
func TestUntracedSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	finality.New(finality.Options{
		Networks:   map[string]finality.NetworkChain{"ETH_MAINNET": {Chain: waitingChain{}}, "BASE_MAINNET": {Chain: waitingChain{}}},
		Registerer: reg,
	})
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil {
				continue
			}
			key := f.GetName()
			for _, p := range m.GetLabel() {
				key += "/" + p.GetValue()
			}
			got[key] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{
		"settle_finality_checks_total/BASE_MAINNET/untraced": 0,
		"settle_finality_checks_total/ETH_MAINNET/untraced":  0,
		"settle_reorg_watch_total/BASE_MAINNET/untraced":     0,
		"settle_reorg_watch_total/ETH_MAINNET/untraced":      0,
		"settle_payout_reorged_total/BASE_MAINNET":           0,
		"settle_payout_reorged_total/ETH_MAINNET":            0,
	}, got)
}
