package finality_test

import (
	"testing"
	"time"

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
