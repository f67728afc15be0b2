package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/scan"
)

// TestScanBatchesInFlight: SCAN_BATCHES_IN_FLIGHT defaults to two, takes
// 1 to scan.BatchesInFlightLimit, and any other value is a problem naming
// the setting.
func TestScanBatchesInFlight(t *testing.T) {
	env := config.FromMap(map[string]string{})
	require.Equal(t, scan.BatchesInFlightDefault, readScanSettings(env).BatchesInFlight)
	require.NoError(t, env.Err())
	for _, v := range []string{"1", "8"} {
		env := config.FromMap(map[string]string{"SCAN_BATCHES_IN_FLIGHT": v})
		s := readScanSettings(env)
		require.NoError(t, env.Err(), v)
		require.Equal(t, v, strconv.Itoa(s.BatchesInFlight))
	}
	for _, v := range []string{"0", "9", "-1", "two"} {
		env := config.FromMap(map[string]string{"SCAN_BATCHES_IN_FLIGHT": v})
		readScanSettings(env)
		require.ErrorContains(t, env.Err(), "SCAN_BATCHES_IN_FLIGHT", "%q", v)
	}
}
