package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// lyingChainStack is a chain stack whose worker asks the chain through a
// proxy that can lie like a lagging, load-balanced backend.
type lyingChainStack struct {
	*chainStack
	proxy  *devchain.Proxy
	worker *harness.Proc
}

func newLyingChainStack(t *testing.T, extra map[string]string) *lyingChainStack {
	t.Helper()
	c := newChainStack(t, "confirmations:1", extra)
	proxy, err := devchain.NewProxy(c.chain.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "worker") {
			p.Stop(10 * time.Second)
		}
	}
	worker := c.StartWorker(map[string]string{"ETH_RPC_URL": proxy.URL()})
	return &lyingChainStack{chainStack: c, proxy: proxy, worker: worker}
}

// watchedState is what the watcher keeps about a credited deposit.
type watchedState struct {
	chainState  string
	blockNumber uint64
	blockHash   string
	absent      bool
	absentHead  int64
}

func (c *chainStack) watched(t *testing.T, id string) watchedState {
	t.Helper()
	var w watchedState
	var head *int64
	require.NoError(t, c.DB.QueryRow(context.Background(), `SELECT COALESCE(chain_state, ''), COALESCE(block_number, 0), COALESCE(block_hash, ''),
		absent_since IS NOT NULL, absent_head FROM payment_events WHERE event_id = $1`, id).Scan(&w.chainState, &w.blockNumber, &w.blockHash, &w.absent, &head))
	if head != nil {
		w.absentHead = *head
	}
	return w
}

// creditWatched sends ETH to user 1's address, reports it, and waits
// until it is credited and watched (confirmations:1 is before finality).
func (c *chainStack) creditWatched(t *testing.T, id string, from int, user int64, to string, eth int64) devchain.Tx {
	t.Helper()
	tx, err := c.chain.SendETH(context.Background(), from, to, wei(eth))
	require.NoError(t, err)
	c.deposit(t, id, user, "ETH", strconv.FormatInt(eth, 10), tx.Hash)
	c.waitStatus(t, id, "confirmed")
	require.Equal(t, watchedState{chainState: "watching", blockNumber: tx.BlockNumber, blockHash: tx.BlockHash}, c.watched(t, id))
	return tx
}

// requireCreditKept: the deposit is credited once, never compensated.
func (c *chainStack) requireCreditKept(t *testing.T, id string, user int64, eth string) {
	t.Helper()
	status, _, _ := c.event(t, id)
	require.Equal(t, "confirmed", status)
	require.Equal(t, eth, c.balance(t, user, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1 AND amount = $2::numeric`, id, eth))
	require.Zero(t, c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1`, "reorg:"+id))
	require.Zero(t, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1`, "reorg:"+id))
}

// requireCompensatedOnce: one compensation event, one negative journal
// row, the balance back where it was.
func (c *chainStack) requireCompensatedOnce(t *testing.T, id string, user int64, eth string) {
	t.Helper()
	c.WaitFor("reorg:"+id+" confirmed", time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'confirmed'`, "reorg:"+id) == 1
	})
	c.WaitFor("quiet", 30*time.Second, c.AllTerminal)
	time.Sleep(time.Second) // a few more watcher passes: nothing more may happen
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND event_type = 'reorg_compensation'`, "reorg:"+id))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1`, "reorg:"+id))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1 AND amount = -$2::numeric`, "reorg:"+id, eth))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1 AND amount = $2::numeric`, id, eth))
	require.Equal(t, "0", c.balance(t, user, "ETH"))
	status, _, _ := c.event(t, id)
	require.Equal(t, "confirmed", status, "the original stays confirmed; the compensation reverses it")
	require.Equal(t, "reorged", c.watched(t, id).chainState)
}

// watchCount reads the worker's settle_reorg_watch_total for a state (0
// before the first).
func watchCount(worker *harness.Proc, state string) float64 {
	return max(0, metricValue(worker.URL(), fmt.Sprintf(`settle_reorg_watch_total{network="ETH_MAINNET",state=%q}`, state)))
}

// mineFor seals a block every interval for d.
func mineFor(t *testing.T, c *devchain.Chain, d, interval time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		_, err := c.Commit(context.Background())
		require.NoError(t, err)
		time.Sleep(interval)
	}
}

// TestSingleNullReceiptIsNoEvidence: one null receipt for a credited,
// watched deposit is recorded as an absence, forgotten on the next read,
// and never compensates, even with a short REORG_RECHECK_DELAY and blocks
// being mined.
func TestSingleNullReceiptIsNoEvidence(t *testing.T) {
	c := newLyingChainStack(t, map[string]string{"REORG_RECHECK_DELAY": "1s"})
	tx := c.creditWatched(t, "null-once", 0, 1, addrUser1, 1)

	c.proxy.NullReceipt(tx.Hash, 1)
	c.WaitFor("the null told", 30*time.Second, func() bool { return c.proxy.Told("eth_getTransactionReceipt") == 1 })
	c.WaitFor("the absence seen", 30*time.Second, func() bool { return watchCount(c.worker, "absent") >= 1 })
	mineFor(t, c.chain, 3*time.Second, 300*time.Millisecond)
	c.WaitFor("the absence forgotten", 30*time.Second, func() bool { return !c.watched(t, "null-once").absent })

	require.Equal(t, watchedState{chainState: "watching", blockNumber: tx.BlockNumber, blockHash: tx.BlockHash}, c.watched(t, "null-once"))
	require.EqualValues(t, 1, watchCount(c.worker, "absent"))
	require.Zero(t, watchCount(c.worker, "gone"))
	c.requireCreditKept(t, "null-once", 1, "1")
	requireInvariants(t, c.Stack)
}

// TestNullReceiptsFor20sAreNoEvidence: a backend that answers null for
// 20 s while blocks are mined, under the default REORG_RECHECK_DELAY
// (30s), is a recorded absence and nothing more; when it answers again
// the absence is forgotten and the credit stands.
func TestNullReceiptsFor20sAreNoEvidence(t *testing.T) {
	c := newLyingChainStack(t, nil)
	tx := c.creditWatched(t, "null-20s", 0, 1, addrUser1, 1)
	head, err := c.chain.Head(context.Background())
	require.NoError(t, err)

	c.proxy.NullReceipt(tx.Hash, devchain.Forever)
	mineFor(t, c.chain, 20*time.Second, time.Second)
	w := c.watched(t, "null-20s")
	require.True(t, w.absent, "the absence is recorded")
	require.GreaterOrEqual(t, w.absentHead, int64(head))
	now, err := c.chain.Head(context.Background())
	require.NoError(t, err)
	require.Greater(t, int64(now), w.absentHead, "blocks were mined after the first absence")
	require.Greater(t, watchCount(c.worker, "absent"), float64(10), "the watcher kept reading nulls")
	c.requireCreditKept(t, "null-20s", 1, "1")

	c.proxy.Clear()
	c.WaitFor("the absence forgotten", 30*time.Second, func() bool { return !c.watched(t, "null-20s").absent })
	require.Equal(t, watchedState{chainState: "watching", blockNumber: tx.BlockNumber, blockHash: tx.BlockHash}, c.watched(t, "null-20s"))
	c.requireCreditKept(t, "null-20s", 1, "1")
	requireInvariants(t, c.Stack)
}

// TestAbsenceBeyondDelayAndBlockCompensatesOnce: a receipt absent on
// reads REORG_RECHECK_DELAY apart is not yet evidence while no new block
// has come; one block later it is, and the deposit is compensated once.
func TestAbsenceBeyondDelayAndBlockCompensatesOnce(t *testing.T) {
	c := newLyingChainStack(t, map[string]string{"REORG_RECHECK_DELAY": "2s"})
	tx := c.creditWatched(t, "absent-long", 0, 1, addrUser1, 1)

	c.proxy.NullReceipt(tx.Hash, devchain.Forever)
	c.WaitFor("the absence recorded", 30*time.Second, func() bool { return c.watched(t, "absent-long").absent })
	c.WaitFor("the delay passed", 30*time.Second, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'absent-long' AND absent_since < now() - interval '3 seconds'`) == 1
	})
	time.Sleep(time.Second) // more passes past the delay, on the same head
	c.requireCreditKept(t, "absent-long", 1, "1")

	_, err := c.chain.Commit(context.Background())
	require.NoError(t, err)
	c.requireCompensatedOnce(t, "absent-long", 1, "1")
	requireInvariants(t, c.Stack)
}

// TestForkMovesOneDepositAndDropsAnother: a real fork drops one credited
// transaction (its nonce taken by a replacement) and mines another one
// again in another block. The dropped one is compensated once; the moved
// one keeps its credit and its evidence follows it to the new block,
// until that block is final.
func TestForkMovesOneDepositAndDropsAnother(t *testing.T) {
	c := newChainStack(t, "confirmations:1", nil)
	ctx := context.Background()
	dropped := c.creditWatched(t, "fork-dropped", 0, 1, addrUser1, 1)
	moved := c.creditWatched(t, "fork-moved", 1, 2, addrUser2, 2)
	require.Greater(t, moved.BlockNumber, dropped.BlockNumber)

	_, err := c.chain.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)
	number, hash := receiptBlock(t, c.chain.URL(), moved.Hash)
	require.NotEqual(t, moved.BlockHash, hash)
	require.NotEqual(t, moved.BlockNumber, number, "mined again at another height")

	c.requireCompensatedOnce(t, "fork-dropped", 1, "1")
	c.WaitFor("the evidence moved", 30*time.Second, func() bool { return c.watched(t, "fork-moved").blockHash == hash })
	require.Equal(t, watchedState{chainState: "watching", blockNumber: number, blockHash: hash}, c.watched(t, "fork-moved"))
	c.requireCreditKept(t, "fork-moved", 2, "2")

	require.NoError(t, c.chain.FinalizeThrough(ctx, number))
	c.WaitFor("the moved deposit final", 30*time.Second, func() bool { return c.watched(t, "fork-moved").chainState == "final" })
	require.Equal(t, watchedState{chainState: "final", blockNumber: number, blockHash: hash}, c.watched(t, "fork-moved"))
	c.requireCreditKept(t, "fork-moved", 2, "2")
	requireInvariants(t, c.Stack)
}

// receiptBlock reads where the node has a transaction's receipt now.
func receiptBlock(t *testing.T, url, txHash string) (uint64, string) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":[%q]}`, txHash)
	resp, err := http.Post(url, "application/json", bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out struct {
		Result *struct {
			BlockNumber string `json:"blockNumber"`
			BlockHash   string `json:"blockHash"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(data, &out))
	require.NotNil(t, out.Result, "no receipt for %s", txHash)
	number, err := strconv.ParseUint(strings.TrimPrefix(out.Result.BlockNumber, "0x"), 16, 64)
	require.NoError(t, err)
	return number, strings.ToLower(out.Result.BlockHash)
}
