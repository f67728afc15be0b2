package finality_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
)

func TestReorgRecheckDelaySetting(t *testing.T) {
	env := config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none"})
	require.Equal(t, finality.ReorgRecheckDelayDefault, finality.ReadSettings(env, true).ReorgRecheckDelay)
	require.NoError(t, env.Err())

	env = config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none", "REORG_RECHECK_DELAY": "5s"})
	require.Equal(t, 5*time.Second, finality.ReadSettings(env, true).ReorgRecheckDelay)
	require.NoError(t, env.Err())

	for _, bad := range []string{"soon", "0s", "-30s", "30"} {
		env := config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none", "REORG_RECHECK_DELAY": bad})
		finality.ReadSettings(env, true)
		require.ErrorContains(t, env.Err(), "REORG_RECHECK_DELAY", "value %q", bad)
	}
}

func TestResponseMaxSetting(t *testing.T) {
	env := config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none"})
	require.Equal(t, int64(chain.ResponseMaxDefault), finality.ReadSettings(env, true).ResponseMax)
	require.NoError(t, env.Err())

	env = config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none", "RPC_RESPONSE_MAX": "268435456"})
	require.Equal(t, int64(256<<20), finality.ReadSettings(env, true).ResponseMax)
	require.NoError(t, env.Err())

	for _, bad := range []string{"128MiB", "-1", "0", "1048575", "1073741825"} {
		env := config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none", "RPC_RESPONSE_MAX": bad})
		finality.ReadSettings(env, true)
		require.ErrorContains(t, env.Err(), "RPC_RESPONSE_MAX", "value %q", bad)
	}
}

// TestEachNetworksPolicyIsItsOwn: DEPOSIT_FINALITY_<NETWORK> overrides the
// policy for that network alone; the networks listed after ETH_MAINNET
// keep DEPOSIT_FINALITY, not its override.
func TestEachNetworksPolicyIsItsOwn(t *testing.T) {
	for _, order := range []string{"ETH_MAINNET,BASE_MAINNET,ARB_MAINNET", "BASE_MAINNET,ETH_MAINNET,ARB_MAINNET"} {
		env := config.FromMap(map[string]string{
			"NETWORKS": order, "DEPOSIT_FINALITY": "finalized", "DEPOSIT_FINALITY_ETH_MAINNET": "confirmations:12",
			"DEPOSIT_FINALITY_ARB_MAINNET": "confirmations:3",
		})
		s := finality.ReadSettings(env, false)
		require.NoError(t, env.Err())
		policies := map[string]string{}
		for _, n := range s.Networks {
			policies[n.Name] = n.Policy.String()
		}
		require.Equal(t, map[string]string{"ETH_MAINNET": "confirmations:12", "BASE_MAINNET": "finalized", "ARB_MAINNET": "confirmations:3"}, policies, order)
	}
}

// TestGateKnowsEachNetworksRPC: the api's gate (and so the intake) reads
// the same per-network settings as the worker's: a network without
// RPC_URL_<NETWORK> cannot be asked, whatever the others have.
func TestGateKnowsEachNetworksRPC(t *testing.T) {
	env := config.FromMap(map[string]string{
		"NETWORKS": "ETH_MAINNET,BASE_MAINNET,ARB_MAINNET", "ETH_RPC_URL": "http://127.0.0.1:1",
		"RPC_URL_ARB_MAINNET": "http://127.0.0.1:2", "DEPOSIT_FINALITY_BASE_MAINNET": "none",
	})
	s := finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
	gate, closeGate, err := finality.Open(context.Background(), s, finality.Deps{Log: zerolog.Nop()})
	require.NoError(t, err)
	defer closeGate()
	require.True(t, gate.HasRPC("ETH_MAINNET"))
	require.True(t, gate.HasRPC("ARB_MAINNET"))
	require.False(t, gate.HasRPC("BASE_MAINNET"))
	require.False(t, gate.HasRPC("OPT_MAINNET"), "not enabled")
	require.True(t, finality.NewRechecker(gate, nil).HasRPC("ETH_MAINNET"))
}

// TestInternalTransferCheckSetting: internal transfers are checked against
// their trace unless the operator says status, for every network
// (INTERNAL_TRANSFER_CHECK) or one (INTERNAL_TRANSFER_CHECK_<NETWORK>).
func TestInternalTransferCheckSetting(t *testing.T) {
	statusOnly := func(vars map[string]string) map[string]bool {
		t.Helper()
		vars["NETWORKS"], vars["DEPOSIT_FINALITY"] = "ETH_MAINNET,BASE_MAINNET", "none"
		env := config.FromMap(vars)
		s := finality.ReadSettings(env, true)
		require.NoError(t, env.Err())
		out := map[string]bool{}
		for _, n := range s.Networks {
			out[n.Name] = n.InternalStatusOnly
		}
		return out
	}
	require.Equal(t, map[string]bool{"ETH_MAINNET": false, "BASE_MAINNET": false}, statusOnly(map[string]string{}))
	require.Equal(t, map[string]bool{"ETH_MAINNET": false, "BASE_MAINNET": true},
		statusOnly(map[string]string{"INTERNAL_TRANSFER_CHECK_BASE_MAINNET": "status"}))
	require.Equal(t, map[string]bool{"ETH_MAINNET": false, "BASE_MAINNET": true},
		statusOnly(map[string]string{"INTERNAL_TRANSFER_CHECK": "status", "INTERNAL_TRANSFER_CHECK_ETH_MAINNET": "trace"}))
	for _, name := range []string{"INTERNAL_TRANSFER_CHECK", "INTERNAL_TRANSFER_CHECK_ETH_MAINNET"} {
		env := config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none", name: "none"})
		finality.ReadSettings(env, true)
		require.ErrorContains(t, env.Err(), name)
	}
}

// TestWorkerNamesETHRPCURLWhenMissing: CONTRACT.md's settings table makes
// ETH_RPC_URL the worker's required setting, and a binary missing one
// exits naming it; RPC_URL_ETH_MAINNET is only its alias.
func TestWorkerNamesETHRPCURLWhenMissing(t *testing.T) {
	env := config.FromMap(map[string]string{})
	finality.ReadSettings(env, true)
	require.Len(t, env.Errs(), 1)
	require.ErrorContains(t, env.Err(), "setting ETH_RPC_URL: required (or its alias RPC_URL_ETH_MAINNET)")

	env = config.FromMap(map[string]string{"NETWORKS": "ETH_MAINNET,BASE_MAINNET", "RPC_URL_ETH_MAINNET": "http://127.0.0.1:1"})
	finality.ReadSettings(env, true)
	require.Len(t, env.Errs(), 1)
	require.ErrorContains(t, env.Err(), "setting RPC_URL_BASE_MAINNET: required when")

	env = config.FromMap(map[string]string{"DEPOSIT_FINALITY": "none"})
	finality.ReadSettings(env, true)
	require.NoError(t, env.Err())
}
