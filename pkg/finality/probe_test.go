//go:build !fuzzing

package finality_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/finality"
)

// syncBuffer is written by the probe's goroutine while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestTraceProbeAtStart: the worker tells at start which networks'
// endpoints lack debug_traceTransaction while INTERNAL_TRANSFER_CHECK is
// trace there (a warning naming the network and both ways out, and
// settle_internal_transfer_check_untraceable 1), not only once an
// internal deposit waits. A network under status is not asked; a node
// down at start is asked again once it answers, and nothing stops.
func TestTraceProbeAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	serve := func(opts devchain.Options) string {
		t.Helper()
		opts.Manual = true
		ch, err := devchain.Serve(ctx, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		return ch.URL()
	}
	downPort, err := devenv.FreePort() // nothing listens there yet
	require.NoError(t, err)
	s := finality.Settings{Networks: []finality.NetworkSettings{
		{Name: "ETH_MAINNET", RPCURL: serve(devchain.Options{})},
		{Name: "BASE_MAINNET", RPCURL: serve(devchain.Options{NoTraces: true})},
		{Name: "POLYGON_MAINNET", RPCURL: serve(devchain.Options{NoTraces: true}), InternalStatusOnly: true},
		{Name: "ARBITRUM_ONE", RPCURL: fmt.Sprintf("http://127.0.0.1:%d", downPort)},
	}}
	clients := finality.Clients{}
	for _, n := range s.Networks {
		client, err := chain.Dial(ctx, n.RPCURL, chain.ClientOptions{
			Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(), CallTimeout: time.Second,
			Breaker: chain.BreakerSettings{ErrorsMax: 1000, ErrorWindow: time.Minute},
		})
		require.NoError(t, err)
		t.Cleanup(client.Close)
		clients[n.Name] = client
	}
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	probe := finality.NewTraceProbe(reg, 2*time.Second, zerolog.New(logs))
	done := make(chan struct{})
	go func() {
		defer close(done)
		probe.Run(ctx, s, clients, 50*time.Millisecond)
	}()

	untraceable := func() map[string]float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, family := range families {
			if family.GetName() != "settle_internal_transfer_check_untraceable" {
				continue
			}
			for _, m := range family.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	want := map[string]float64{"ETH_MAINNET": 0, "BASE_MAINNET": 1, "POLYGON_MAINNET": 0}
	require.Eventually(t, func() bool { return len(untraceable()) == len(want) }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, want, untraceable(), "the node that is down is not said either way")
	require.Contains(t, logs.String(), "BASE_MAINNET's RPC does not serve debug_traceTransaction")
	require.Contains(t, logs.String(), "give RPC_URL_BASE_MAINNET an endpoint with the debug API, or set INTERNAL_TRANSFER_CHECK_BASE_MAINNET=status")
	require.NotContains(t, logs.String(), "POLYGON_MAINNET's RPC", "status asks for no trace")
	// The down node is asked last, after the others' gauges are set.
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "could not ask the RPC whether it serves debug_traceTransaction")
	}, 30*time.Second, 20*time.Millisecond)

	// The node comes up (without the debug API): asked again, and told.
	serve(devchain.Options{Port: downPort, NoTraces: true})
	require.Eventually(t, func() bool { return untraceable()["ARBITRUM_ONE"] == 1 }, 30*time.Second, 20*time.Millisecond)
	// The gauge is set just before the warning is written.
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "ARBITRUM_ONE's RPC does not serve debug_traceTransaction")
	}, 30*time.Second, 20*time.Millisecond)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe goes on once every network has answered")
	}
}
