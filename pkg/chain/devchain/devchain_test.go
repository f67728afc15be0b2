package devchain_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
)

const testTimeout = 2 * time.Minute

func start(t *testing.T, opts devchain.Options) *devchain.Chain {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	c, err := devchain.Serve(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// rpcCall asks the chain over its real HTTP endpoint.
func rpcCall(t *testing.T, url, method string, params ...any) json.RawMessage {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Nil(t, out.Error, "rpc error")
	return out.Result
}

func blockNumberOverHTTP(t *testing.T, url, tag string) uint64 {
	t.Helper()
	var block struct {
		Number string `json:"number"`
	}
	require.NoError(t, json.Unmarshal(rpcCall(t, url, "eth_getBlockByNumber", tag, false), &block))
	var n uint64
	_, err := fmt.Sscanf(block.Number, "0x%x", &n)
	require.NoError(t, err)
	return n
}

func TestTokenTransferRevertAndFinality(t *testing.T) {
	c := start(t, devchain.Options{Manual: true})
	ctx := context.Background()
	accounts := c.Accounts()
	require.Len(t, accounts, devchain.AccountsDefault)

	token, deploy, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, deploy.Status)

	value := new(big.Int).Lsh(big.NewInt(1), 200) // a large value survives encoding
	tx, err := c.TransferToken(ctx, 0, token, accounts[1].Address, value)
	require.NoError(t, err)
	require.EqualValues(t, 1, tx.Status)

	var receipt struct {
		Status string `json:"status"`
		Logs   []struct {
			Address string   `json:"address"`
			Topics  []string `json:"topics"`
			Data    string   `json:"data"`
		} `json:"logs"`
	}
	require.NoError(t, json.Unmarshal(rpcCall(t, c.URL(), "eth_getTransactionReceipt", tx.Hash), &receipt))
	require.Equal(t, "0x1", receipt.Status)
	require.Len(t, receipt.Logs, 1)
	l := receipt.Logs[0]
	require.Equal(t, token, l.Address)
	require.Equal(t, []string{
		"0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef",
		"0x000000000000000000000000" + accounts[0].Address[2:],
		"0x000000000000000000000000" + accounts[1].Address[2:],
	}, l.Topics)
	require.Equal(t, fmt.Sprintf("0x%064x", value), l.Data)

	reverted, err := c.SendReverting(ctx, 0, token)
	require.NoError(t, err)
	require.EqualValues(t, 0, reverted.Status)

	// Finality lags the head and FinalizeThrough pushes it past a block.
	head, err := c.Head(ctx)
	require.NoError(t, err)
	require.Less(t, blockNumberOverHTTP(t, c.URL(), "finalized"), tx.BlockNumber)
	require.Equal(t, head, blockNumberOverHTTP(t, c.URL(), "latest"))
	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	require.GreaterOrEqual(t, blockNumberOverHTTP(t, c.URL(), "finalized"), tx.BlockNumber)
}

func TestReorgDropsTransaction(t *testing.T) {
	c := start(t, devchain.Options{Manual: true})
	ctx := context.Background()
	accounts := c.Accounts()

	keep, err := c.SendETH(ctx, 1, accounts[3].Address, big.NewInt(7))
	require.NoError(t, err)
	drop, err := c.SendETH(ctx, 0, accounts[2].Address, big.NewInt(1_000))
	require.NoError(t, err)
	// Another transaction after it, from another sender, survives.
	later, err := c.SendETH(ctx, 1, accounts[3].Address, big.NewInt(8))
	require.NoError(t, err)
	require.NoError(t, c.CommitBlocks(ctx, 2))

	r, err := c.Reorg(ctx, drop.Hash)
	require.NoError(t, err)
	require.Equal(t, drop.BlockNumber-1, r.ForkedAt)
	require.Greater(t, r.NewHead, r.OldHead)

	require.Equal(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", drop.Hash)))
	var block struct {
		Hash string `json:"hash"`
	}
	require.NoError(t, json.Unmarshal(rpcCall(t, c.URL(), "eth_getBlockByNumber", fmt.Sprintf("0x%x", drop.BlockNumber), false), &block))
	require.NotEqual(t, drop.BlockHash, block.Hash, "the block at that height changed")

	var kept struct {
		BlockHash string `json:"blockHash"`
	}
	require.NoError(t, json.Unmarshal(rpcCall(t, c.URL(), "eth_getTransactionReceipt", keep.Hash), &kept))
	require.Equal(t, keep.BlockHash, kept.BlockHash, "blocks below the fork stay")
	require.NotEqual(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", later.Hash)), "other dropped transactions are mined again")
	require.NotEqual(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", r.Replacement)))

	// A finalized block cannot be reorged.
	require.NoError(t, c.FinalizeThrough(ctx, keep.BlockNumber))
	_, err = c.Reorg(ctx, keep.Hash)
	require.ErrorContains(t, err, "finalized")
}

// TestDropThenResend: Drop takes a transaction off the chain with no
// replacement; the other transactions of the dropped blocks are mined
// again, except the sender's later one, which waits behind it; Resend
// mines the very same transaction again, and the later one with it.
func TestDropThenResend(t *testing.T) {
	c := start(t, devchain.Options{Manual: true})
	ctx := context.Background()
	accounts := c.Accounts()

	drop, err := c.SendETH(ctx, 0, accounts[2].Address, big.NewInt(1_000))
	require.NoError(t, err)
	other, err := c.SendETH(ctx, 1, accounts[3].Address, big.NewInt(8))
	require.NoError(t, err)
	behind, err := c.SendETH(ctx, 0, accounts[3].Address, big.NewInt(9))
	require.NoError(t, err)
	require.NoError(t, c.CommitBlocks(ctx, 2))

	r, tx, err := c.Drop(ctx, drop.Hash)
	require.NoError(t, err)
	require.Equal(t, drop.BlockNumber-1, r.ForkedAt)
	require.Greater(t, r.NewHead, r.OldHead)
	require.Equal(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", drop.Hash)))
	require.NotEqual(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", other.Hash)), "another sender's transaction is mined again")
	require.Equal(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", behind.Hash)), "the sender's later one waits behind the dropped one")

	again, err := c.Resend(ctx, tx)
	require.NoError(t, err)
	require.Equal(t, drop.Hash, again.Hash)
	require.Greater(t, again.BlockNumber, r.NewHead)
	require.EqualValues(t, 1, again.Status)
	require.NotEqual(t, "null", string(rpcCall(t, c.URL(), "eth_getTransactionReceipt", behind.Hash)), "mined with it")

	require.NoError(t, c.FinalizeThrough(ctx, again.BlockNumber))
	_, _, err = c.Drop(ctx, drop.Hash)
	require.ErrorContains(t, err, "finalized")
}

func TestTimerProducesBlocks(t *testing.T) {
	c := start(t, devchain.Options{BlockInterval: 50 * time.Millisecond})
	ctx := context.Background()
	first, err := c.Head(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		head, err := c.Head(ctx)
		return err == nil && head >= first+3
	}, testTimeout, 20*time.Millisecond)
	// Helpers wait for the timer to mine their transaction.
	tx, err := c.SendETH(ctx, 0, c.Accounts()[1].Address, big.NewInt(1))
	require.NoError(t, err)
	require.EqualValues(t, 1, tx.Status)
}

func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	cancel()
	require.Eventually(t, func() bool {
		resp, err := http.Post(c.URL(), "application/json", bytes.NewReader([]byte(`{}`)))
		if err != nil {
			return true
		}
		_ = resp.Body.Close()
		return false
	}, testTimeout, 20*time.Millisecond)
	require.NoError(t, c.Close())
}
