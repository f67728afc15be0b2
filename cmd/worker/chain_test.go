package main

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/testenv"
)

// TestGateWithoutAnyRPC: a worker with no RPC at all still has a gate
// (pkg/finality's TestGateWithoutAnyRPC: what it lets through); without
// one, every deposit naming a transaction was credited unasked, on
// networks taken out of NETWORKS too.
func TestGateWithoutAnyRPC(t *testing.T) {
	env := config.FromMap(map[string]string{"NETWORKS": "ETH_MAINNET", "DEPOSIT_FINALITY": "finalized", "DEPOSIT_FINALITY_ETH_MAINNET": "none"})
	s := finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
	gate, closeGate, err := newGate(context.Background(), s, nil, nil, nil, nil, zerolog.Nop(), nil, nil)
	require.NoError(t, err)
	defer closeGate()
	require.NotNil(t, gate)
}

// TestGateProbesTheDebugAPI: the worker asks at start whether each
// endpoint serves debug_traceTransaction, which INTERNAL_TRANSFER_CHECK=
// trace needs: on one that does not it starts all the same, and says so
// by settle_internal_transfer_check_untraceable; closing the gate stops
// the probe.
func TestGateProbesTheDebugAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	env := config.FromMap(map[string]string{"NETWORKS": "ETH_MAINNET", "DEPOSIT_FINALITY": "none", "ETH_RPC_URL": ch.URL()})
	s := finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
	db := testenv.OpenDB(t, testenv.DatabaseURL(t))
	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	alerts := alert.New(zerolog.Nop(), alert.Options{})
	defer alerts.Close()
	gate, closeGate, err := newGate(ctx, s, db, registry, nil, alerts, zerolog.Nop(), reg, func(error) {})
	require.NoError(t, err, "a node without the debug API does not stop the worker")
	require.NotNil(t, gate)
	require.Eventually(t, func() bool {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, family := range families {
			if family.GetName() == "settle_internal_transfer_check_untraceable" {
				m := family.GetMetric()
				return len(m) == 1 && m[0].GetLabel()[0].GetValue() == "ETH_MAINNET" && m[0].GetGauge().GetValue() == 1
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond)
	closeGate()
}
