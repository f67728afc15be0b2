package chain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// lyingNode is a dev chain behind a proxy that can lie, and a checker
// that asks through it.
func lyingNode(t *testing.T) (*devchain.Chain, *devchain.Proxy, *worker) {
	t.Helper()
	c := startChain(t)
	p, err := devchain.NewProxy(c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return c, p, newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
}

func stillCanonical(t *testing.T, w *worker, txHash string, number uint64, hash string) Canonicity {
	t.Helper()
	seen, err := w.checker.StillCanonical(testContext(t), txHash, number, hash)
	require.NoError(t, err)
	return seen
}

// rawReceipt reads a receipt's JSON straight from the node.
func rawReceipt(t *testing.T, url, txHash string) json.RawMessage {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":[%q]}`, txHash)
	resp, err := http.Post(url, "application/json", bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out struct {
		Result json.RawMessage `json:"result"`
	}
	require.NoError(t, json.Unmarshal(data, &out))
	require.NotEqual(t, "null", string(out.Result))
	return out.Result
}

// TestNullReceiptIsAbsentNotGone: a receipt the node answers null for,
// while the block at its height still has its hash (or the node has no
// block there yet), is Absent, with the head seen; never Gone. The next
// honest answer is Canonical again.
func TestNullReceiptIsAbsentNotGone(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	advanceTo(t, c, 5)
	tx, err := c.SendETH(ctx, 0, c.Accounts()[1].Address, big.NewInt(1))
	require.NoError(t, err)
	advanceTo(t, c, 9)

	p.NullReceipt(tx.Hash, 1)
	require.Equal(t, Canonicity{
		State: Absent, BlockNumber: tx.BlockNumber, BlockHash: tx.BlockHash, Head: 9,
		Reason: fmt.Sprintf("no receipt; block %d still has hash %s", tx.BlockNumber, tx.BlockHash),
	}, stillCanonical(t, w, tx.Hash, tx.BlockNumber, tx.BlockHash))
	require.EqualValues(t, 1, p.Told("eth_getTransactionReceipt"))
	require.Equal(t, Canonical, stillCanonical(t, w, tx.Hash, tx.BlockNumber, tx.BlockHash).State)

	// A node that lags behind the block: no receipt, no block there.
	p.NullReceipt(tx.Hash, 1)
	p.Answer("eth_getBlockByNumber", fmt.Sprintf("0x%x", tx.BlockNumber), json.RawMessage("null"), 1)
	seen := stillCanonical(t, w, tx.Hash, tx.BlockNumber, tx.BlockHash)
	require.Equal(t, Absent, seen.State)
	require.Equal(t, fmt.Sprintf("no receipt; the node has no block %d yet", tx.BlockNumber), seen.Reason)
	require.EqualValues(t, 9, seen.Head)
}

// TestReorgGoneMovedAndStale: a real fork drops one transaction (Gone:
// no receipt, and another block at its height) and mines another one
// again lower down (Moved, with the new block, Final once that block is,
// also from the cache). A backend still serving the old receipt of the
// moved transaction makes it Absent, not Gone and not Canonical.
func TestReorgGoneMovedAndStale(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[2].Address
	advanceTo(t, c, 3)
	dropped, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	moved, err := c.SendETH(ctx, 1, to, big.NewInt(2_000))
	require.NoError(t, err)
	require.Greater(t, moved.BlockNumber, dropped.BlockNumber)
	staleReceipt := rawReceipt(t, c.URL(), moved.Hash)

	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)

	gone := stillCanonical(t, w, dropped.Hash, dropped.BlockNumber, dropped.BlockHash)
	require.Equal(t, Gone, gone.State)
	require.Contains(t, gone.Reason, fmt.Sprintf("no receipt; block %d now has hash", dropped.BlockNumber))

	seen := stillCanonical(t, w, moved.Hash, moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Moved, seen.State)
	require.False(t, seen.Final)
	again := rawReceipt(t, c.URL(), moved.Hash)
	var now struct {
		BlockNumber string `json:"blockNumber"`
		BlockHash   string `json:"blockHash"`
	}
	require.NoError(t, json.Unmarshal(again, &now))
	require.Equal(t, now.BlockHash, seen.BlockHash)
	require.Equal(t, now.BlockNumber, fmt.Sprintf("0x%x", seen.BlockNumber))
	require.NotEqual(t, moved.BlockNumber, seen.BlockNumber, "mined again at another height")
	require.Equal(t, Canonical, stillCanonical(t, w, moved.Hash, seen.BlockNumber, seen.BlockHash).State)

	// A backend behind the fork still has the old receipt: the header at
	// its height disagrees, so it is no evidence either way.
	p.Answer("eth_getTransactionReceipt", moved.Hash, staleReceipt, 2)
	stale := stillCanonical(t, w, moved.Hash, moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Absent, stale.State)
	require.Contains(t, stale.Reason, "the receipt names block")
	require.Equal(t, Absent, stillCanonical(t, w, moved.Hash, seen.BlockNumber, seen.BlockHash).State)

	require.NoError(t, c.FinalizeThrough(ctx, seen.BlockNumber))
	final := stillCanonical(t, w, moved.Hash, moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Canonicity{State: Moved, BlockNumber: seen.BlockNumber, BlockHash: seen.BlockHash, Final: true, Reason: seen.Reason}, final)
	before := p.Calls("eth_getTransactionReceipt")
	require.Equal(t, final, stillCanonical(t, w, moved.Hash, moved.BlockNumber, moved.BlockHash), "from the final cache")
	require.Equal(t, before, p.Calls("eth_getTransactionReceipt"))
	require.Equal(t, Final, stillCanonical(t, w, moved.Hash, seen.BlockNumber, seen.BlockHash).State)
}

// TestStillCanonicalErrorsAreNotAnswers: a node that fails, answers
// garbage, or gives a receipt in a block it does not have, is an error
// (ask again), never a state the watcher could act on.
func TestStillCanonicalErrorsAreNotAnswers(t *testing.T) {
	c := startChain(t)
	ctx := testContext(t)
	advanceTo(t, c, 2)
	tx, err := c.SendETH(ctx, 0, c.Accounts()[1].Address, big.NewInt(1))
	require.NoError(t, err)
	atHeight := fmt.Sprintf("0x%x", tx.BlockNumber)

	failing := newProxy(t, c.URL())
	w := newWorker(t, failing.URL(), workerOptions{})
	failing.setMode(proxyFail)
	_, err = w.checker.StillCanonical(ctx, tx.Hash, tx.BlockNumber, tx.BlockHash)
	require.ErrorIs(t, err, payment.ErrUnavailable)

	p, err := devchain.NewProxy(c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	w = newWorker(t, p.URL(), workerOptions{})
	garbage := json.RawMessage(`"not a block"`)
	for name, lie := range map[string]func(){
		"receipt in a block the node does not have": func() {
			p.Answer("eth_getBlockByNumber", atHeight, json.RawMessage("null"), devchain.Forever)
		},
		"no receipt, garbage header at its height": func() {
			p.NullReceipt(tx.Hash, devchain.Forever)
			p.Answer("eth_getBlockByNumber", atHeight, garbage, devchain.Forever)
		},
		"no receipt, garbage head": func() {
			p.NullReceipt(tx.Hash, devchain.Forever)
			p.Answer("eth_getBlockByNumber", "latest", garbage, devchain.Forever)
		},
	} {
		t.Run(name, func(t *testing.T) {
			p.Clear()
			lie()
			_, err := w.checker.StillCanonical(ctx, tx.Hash, tx.BlockNumber, tx.BlockHash)
			require.ErrorIs(t, err, payment.ErrUnavailable)
		})
	}
	p.Clear()
	require.Equal(t, Canonical, stillCanonical(t, w, tx.Hash, tx.BlockNumber, tx.BlockHash).State)
}
