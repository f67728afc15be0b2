package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/scan"
	"github.com/settle/settle/pkg/testenv"
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

// TestScanIntervalOff: SCAN_INTERVAL defaults to scan.IntervalDefault,
// takes a positive duration or off (CONTRACT.md, Chain scanner), and off
// starts no scanner even for a network with an RPC, after asking its
// endpoint for the chain id (unreachable here, which stops nothing; a
// wrong one is test/networks_test.go's).
func TestScanIntervalOff(t *testing.T) {
	env := config.FromMap(map[string]string{})
	require.Equal(t, scan.IntervalDefault, readScanSettings(env).Interval)
	require.NoError(t, env.Err())

	env = config.FromMap(map[string]string{"SCAN_INTERVAL": "2s"})
	require.Equal(t, 2*time.Second, readScanSettings(env).Interval)
	require.NoError(t, env.Err())

	for _, v := range []string{"0s", "-1s", "never", "OFF"} {
		env := config.FromMap(map[string]string{"SCAN_INTERVAL": v})
		readScanSettings(env)
		require.ErrorContains(t, env.Err(), "SCAN_INTERVAL", "%q", v)
	}

	env = config.FromMap(map[string]string{"SCAN_INTERVAL": "off", "RPC_URL_ETH_MAINNET": "http://127.0.0.1:1"})
	s := readScanSettings(env)
	require.NoError(t, env.Err())
	require.Zero(t, s.Interval)
	require.True(t, s.Chain.HasRPC(), "the network has an RPC, so only off keeps the scanner from starting")
	alerts := alert.New(zerolog.Nop(), alert.Options{Service: "test"})
	defer alerts.Close()
	stop, err := startScanner(context.Background(), s, testenv.DB(t), nil, alerts, "test", zerolog.Nop(), prometheus.NewRegistry())
	require.NoError(t, err)
	stop()
}
