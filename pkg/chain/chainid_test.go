//go:build !fuzzing

package chain

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
)

// TestClientAnswersNothingBeforeItsChainIsChecked: a client told its
// chain asks eth_chainId before its first call. An endpoint that cannot
// say (down at start, or a garbled answer) is an outage, asked again on
// the next call; one serving another chain answers every call
// ErrWrongChain, none of them reaching the node; once the chain matched,
// it is not asked again, however many calls race the first.
func TestClientAnswersNothingBeforeItsChainIsChecked(t *testing.T) {
	ctx := testContext(t)
	c := startChain(t)
	p, err := devchain.NewProxy(c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	dial := func(chainID int64) *Client {
		client, err := Dial(ctx, p.URL(), ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(), ChainID: chainID})
		require.NoError(t, err)
		t.Cleanup(client.Close)
		return client
	}

	wrong := dial(devchain.ChainID + 4)
	for range 2 {
		_, err := wrong.HeaderByTag(ctx, TagLatest)
		require.ErrorIs(t, err, ErrWrongChain)
		require.ErrorIs(t, err, payment.ErrUnavailable, "waits, never fails a deposit")
	}
	require.Zero(t, p.Calls("eth_getBlockByNumber"), "nothing asked of another chain")
	require.EqualValues(t, 2, p.Calls("eth_chainId"), "asked again: the endpoint may be fixed")

	right := dial(devchain.ChainID)
	p.Answer("eth_chainId", "", json.RawMessage(`"0x0"`), 1) // garbled: not a chain id
	_, err = right.HeaderByTag(ctx, TagLatest)
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.NotErrorIs(t, err, ErrWrongChain)
	require.Zero(t, p.Calls("eth_getBlockByNumber"))

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = right.HeaderByTag(ctx, TagLatest)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 4, p.Calls("eth_chainId"), "two for the wrong client, the garbled one, then one for all eight")
	require.EqualValues(t, 8, p.Calls("eth_getBlockByNumber"))

	// Not told a chain (built without the registry): nothing asked first.
	unchecked := dial(0)
	_, err = unchecked.HeaderByTag(ctx, TagLatest)
	require.NoError(t, err)
	require.EqualValues(t, 4, p.Calls("eth_chainId"))
}
