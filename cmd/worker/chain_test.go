package main

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
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
