package chain

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestRPCErrorSeriesStartAtZero: a new client exports every method's
// error count at 0, so SettleChainRPCErrors' increase() counts the first
// errors (a series first scraped at n shows no increase).
func TestRPCErrorSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newClientMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"network": "ETH_MAINNET"}, reg))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "settle_chain_rpc_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[l["network"]+"/"+l["method"]] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{}
	for _, method := range []string{"eth_chainId", "eth_getTransactionReceipt", "eth_getBlockByNumber", "eth_getTransactionByHash",
		"eth_getLogs", "debug_traceBlockByNumber", "debug_traceBlockByHash", "debug_traceTransaction"} {
		want["ETH_MAINNET/"+method] = 0
	}
	require.Equal(t, want, got)
}
