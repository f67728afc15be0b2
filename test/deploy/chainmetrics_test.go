package deploy

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
)

// TestChainMetricsWrappedByNetwork: the chain clients the worker dials,
// one per network, register their settle_chain_* series with the
// network's name as a label (what wrappedLabels tells the dashboard and
// alert checks), so two networks' series never collide or mix.
func TestChainMetricsWrappedByNetwork(t *testing.T) {
	env := config.FromMap(map[string]string{
		"NETWORKS":             "ETH_MAINNET,BASE_MAINNET",
		"RPC_URL_ETH_MAINNET":  "http://127.0.0.1:9/eth",
		"RPC_URL_BASE_MAINNET": "http://127.0.0.1:9/base",
	})
	s := finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
	reg := prometheus.NewRegistry()
	clients, err := finality.Dial(context.Background(), s, finality.Deps{Log: zerolog.Nop(), Registerer: reg})
	require.NoError(t, err)
	defer clients.Close()

	families, err := reg.Gather()
	require.NoError(t, err)
	networks := map[string]bool{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "settle_chain_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var network string
			for _, l := range m.GetLabel() {
				if l.GetName() == "network" {
					network = l.GetValue()
				}
			}
			require.NotEmpty(t, network, "%s has a series without a network label", f.GetName())
			networks[network] = true
		}
	}
	require.Equal(t, map[string]bool{"ETH_MAINNET": true, "BASE_MAINNET": true}, networks, "settle_chain_* series of both networks")
	for prefix, labels := range wrappedLabels {
		require.Equal(t, "settle_chain_", prefix)
		require.Equal(t, []string{"network"}, labels)
	}
}
