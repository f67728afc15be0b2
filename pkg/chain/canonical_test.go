//go:build !fuzzing

package chain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"sync"
	"testing"
	"time"

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

func stillCanonical(t *testing.T, w *worker, d Deposit, number uint64, hash string) Canonicity {
	t.Helper()
	seen, err := w.checker.StillCanonical(testContext(t), d, number, hash)
	require.NoError(t, err)
	return seen
}

// paid is a native deposit of wei to to by tx.
func paid(tx devchain.Tx, to string, wei int64) Deposit {
	return Deposit{TxHash: tx.Hash, Recipients: []string{to}, Amount: big.NewInt(wei)}
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
	}, stillCanonical(t, w, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash))
	require.EqualValues(t, 1, p.Told("eth_getTransactionReceipt"))
	require.Equal(t, Canonical, stillCanonical(t, w, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash).State)

	// A node that lags behind the block: no receipt, no block there. No
	// absence at all: its head rising as it catches up would make two
	// of its reads look a block apart.
	p.NullReceipt(tx.Hash, 1)
	p.Answer("eth_getBlockByNumber", fmt.Sprintf("0x%x", tx.BlockNumber), json.RawMessage("null"), 1)
	_, err = w.checker.StillCanonical(ctx, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash)
	require.ErrorIs(t, err, ErrNodeBehind)
	require.ErrorIs(t, err, payment.ErrUnavailable)

	// Its block served (by another backend), but a head below it.
	low, err := json.Marshal(map[string]any{"number": "0x3", "hash": fmt.Sprintf("0x%064x", 3), "parentHash": fmt.Sprintf("0x%064x", 2),
		"timestamp": "0x1", "transactions": []string{}})
	require.NoError(t, err)
	p.NullReceipt(tx.Hash, 1)
	p.Answer("eth_getBlockByNumber", "latest", low, 1)
	_, err = w.checker.StillCanonical(ctx, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash)
	require.ErrorIs(t, err, ErrNodeBehind)
	require.Equal(t, Canonical, stillCanonical(t, w, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash).State)
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

	gone := stillCanonical(t, w, paid(dropped, to, 1_000), dropped.BlockNumber, dropped.BlockHash)
	require.Equal(t, Gone, gone.State)
	require.Contains(t, gone.Reason, fmt.Sprintf("no receipt; block %d now has hash", dropped.BlockNumber))

	seen := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
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
	require.Equal(t, Canonical, stillCanonical(t, w, paid(moved, to, 2_000), seen.BlockNumber, seen.BlockHash).State)

	// A backend behind the fork still has the old receipt: the header at
	// its height disagrees, so it is no evidence either way.
	p.Answer("eth_getTransactionReceipt", moved.Hash, staleReceipt, 2)
	stale := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Absent, stale.State)
	require.Contains(t, stale.Reason, "the receipt names block")
	require.Equal(t, Absent, stillCanonical(t, w, paid(moved, to, 2_000), seen.BlockNumber, seen.BlockHash).State)

	require.NoError(t, c.FinalizeThrough(ctx, seen.BlockNumber))
	final := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Canonicity{State: Moved, BlockNumber: seen.BlockNumber, BlockHash: seen.BlockHash, Final: true, Reason: seen.Reason}, final)
	before := p.Calls("eth_getTransactionReceipt")
	require.Equal(t, final, stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash), "from the final cache")
	require.Equal(t, before, p.Calls("eth_getTransactionReceipt"))
	require.Equal(t, Final, stillCanonical(t, w, paid(moved, to, 2_000), seen.BlockNumber, seen.BlockHash).State)
}

// TestOneNullAfterForkIsNotGone: a fork mines a credited transaction
// again lower down. One null receipt, read when the header at the old
// height already shows the new branch, is not evidence: the receipt is
// read again and the transaction is Moved where it now is. Two nulls
// while the block now at the old height lacks it are Gone.
func TestOneNullAfterForkIsNotGone(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[2].Address
	advanceTo(t, c, 3)
	dropped, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	moved, err := c.SendETH(ctx, 1, to, big.NewInt(2_000))
	require.NoError(t, err)
	require.Greater(t, moved.BlockNumber, dropped.BlockNumber)
	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)

	honest := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Moved, honest.State)

	p.NullReceipt(moved.Hash, 1)
	seen := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.Equal(t, honest, seen, "one null receipt after a fork is read again, not taken as Gone")
	require.EqualValues(t, 1, p.Told("eth_getTransactionReceipt"))

	p.NullReceipt(moved.Hash, 2)
	gone := stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.Equal(t, Gone, gone.State, "no receipt on two reads, and the block now at its height lacks it")
	require.Contains(t, gone.Reason, "neither it nor a second read has the transaction")
}

// TestOneNullAfterForkSameHeight: the fork mines the transaction again at
// its own height (the replacing block includes it). One null is read
// again (Moved there); two nulls, while the block now at that height
// lists the transaction, are Absent: canonical there, its receipt index
// behind.
func TestOneNullAfterForkSameHeight(t *testing.T) {
	c, err := devchain.Serve(testContext(t), devchain.Options{BlockInterval: 700 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	p, err := devchain.NewProxy(c.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	w := newWorker(t, p.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	to := c.Accounts()[2].Address

	// Both in one block: one to drop, one the new block keeps.
	var dropped, kept devchain.Tx
	for attempt := 0; dropped.BlockHash == "" || dropped.BlockHash != kept.BlockHash; attempt++ {
		require.Less(t, attempt, 10, "two transactions never landed in one block")
		var wg sync.WaitGroup
		var errDropped, errKept error
		wg.Add(2)
		go func() { defer wg.Done(); dropped, errDropped = c.SendETH(ctx, 0, to, big.NewInt(1_000)) }()
		go func() { defer wg.Done(); kept, errKept = c.SendETH(ctx, 1, to, big.NewInt(2_000)) }()
		wg.Wait()
		require.NoError(t, errDropped)
		require.NoError(t, errKept)
	}
	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)
	honest := stillCanonical(t, w, paid(kept, to, 2_000), kept.BlockNumber, kept.BlockHash)
	require.Equal(t, Moved, honest.State)
	require.Equal(t, kept.BlockNumber, honest.BlockNumber, "mined again at its own height")

	p.NullReceipt(kept.Hash, 1)
	require.Equal(t, honest, stillCanonical(t, w, paid(kept, to, 2_000), kept.BlockNumber, kept.BlockHash))

	p.NullReceipt(kept.Hash, 2)
	seen := stillCanonical(t, w, paid(kept, to, 2_000), kept.BlockNumber, kept.BlockHash)
	require.Equal(t, Absent, seen.State, "in the block now at its height: %s", seen.Reason)
	require.Contains(t, seen.Reason, "which includes the transaction")
	require.Positive(t, seen.Head)
}

// TestForkedNullReceiptErrors: after a fork, a second receipt read that
// fails, or a block at the old height without its transaction list, is
// an error (ask again), never Gone.
func TestForkedNullReceiptErrors(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[2].Address
	advanceTo(t, c, 3)
	dropped, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)
	require.Equal(t, Gone, stillCanonical(t, w, paid(dropped, to, 1_000), dropped.BlockNumber, dropped.BlockHash).State)

	p.NullReceipt(dropped.Hash, 1)
	p.Answer("eth_getTransactionReceipt", "", json.RawMessage(`"not a receipt"`), 1)
	_, err = w.checker.StillCanonical(ctx, paid(dropped, to, 1_000), dropped.BlockNumber, dropped.BlockHash)
	require.ErrorIs(t, err, payment.ErrUnavailable, "the second read failed")

	head, err := w.client.HeaderByNumber(ctx, dropped.BlockNumber)
	require.NoError(t, err)
	noTxs := json.RawMessage(fmt.Sprintf(`{"number":"0x%x","hash":%q,"timestamp":"0x%x"}`, head.Number, head.Hash, head.Time))
	p.Answer("eth_getBlockByNumber", fmt.Sprintf("0x%x", dropped.BlockNumber), noTxs, 1)
	_, err = w.checker.StillCanonical(ctx, paid(dropped, to, 1_000), dropped.BlockNumber, dropped.BlockHash)
	require.ErrorIs(t, err, payment.ErrUnavailable, "the block at its height came without its transactions")
}

// TestMovedWithoutTheTransferIsGone: a fork drops a token's deployment
// and mines the token deposit again on the new branch, where it calls an
// address without code: status 1, no Transfer log. Mined again without
// the transfer it was credited for, the deposit is Gone (compensated),
// not Moved. A native deposit mined again with its value is Moved.
func TestMovedWithoutTheTransferIsGone(t *testing.T) {
	c, _, w := lyingNode(t)
	ctx := testContext(t)
	advanceTo(t, c, 3)
	token, deploy, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)
	to := c.Accounts()[2].Address
	deposit, err := c.TransferToken(ctx, 1, token, to, big.NewInt(5_000_000))
	require.NoError(t, err)
	require.Greater(t, deposit.BlockNumber, deploy.BlockNumber)
	native, err := c.SendETH(ctx, 3, to, big.NewInt(3_000))
	require.NoError(t, err)
	d := Deposit{TxHash: deposit.Hash, Token: token, Recipients: []string{to}, Amount: big.NewInt(5_000_000), Index: "0"}
	require.Equal(t, Canonical, stillCanonical(t, w, d, deposit.BlockNumber, deposit.BlockHash).State)

	_, err = c.Reorg(ctx, deploy.Hash)
	require.NoError(t, err)
	after, err := w.client.Receipt(ctx, deposit.Hash)
	require.NoError(t, err)
	require.NotEqual(t, deposit.BlockHash, after.BlockHash, "mined again in another block")
	require.EqualValues(t, 1, after.Status)
	require.Empty(t, after.Transfers, "on the new branch the transaction moves no token")

	seen := stillCanonical(t, w, d, deposit.BlockNumber, deposit.BlockHash)
	require.Equal(t, Gone, seen.State, "credited for a transfer the canonical chain does not have: %s", seen.Reason)
	require.Equal(t, deposit.BlockHash, seen.BlockHash, "the evidence stays where the deposit was credited")
	require.Contains(t, seen.Reason, fmt.Sprintf("mined again in block %d %s without the deposit's transfer: the receipt has no ERC-20 Transfer log", after.BlockNumber, after.BlockHash))

	moved := stillCanonical(t, w, paid(native, to, 3_000), native.BlockNumber, native.BlockHash)
	require.Equal(t, Moved, moved.State, moved.Reason)
	wrong := stillCanonical(t, w, paid(native, to, 3_001), native.BlockNumber, native.BlockHash)
	require.Equal(t, Gone, wrong.State, "a native deposit the re-mined transaction does not pay")
	require.Contains(t, wrong.Reason, "carries 3000 base units, the deposit says 3001")
}

// TestMovedRecheckErrors: the new receipt is checked against the deposit
// with what a credit needs (the transaction's value, the owner of the
// addresses); a failure there is an error, never a state.
func TestMovedRecheckErrors(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[2].Address
	advanceTo(t, c, 3)
	dropped, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	moved, err := c.SendETH(ctx, 1, to, big.NewInt(2_000))
	require.NoError(t, err)
	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)

	p.Answer("eth_getTransactionByHash", moved.Hash, json.RawMessage(`"not a transaction"`), 1)
	_, err = w.checker.StillCanonical(ctx, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.ErrorIs(t, err, payment.ErrUnavailable)

	owner := Deposit{TxHash: moved.Hash, Amount: big.NewInt(2_000), Owner: failingOwner{}}
	_, err = w.checker.StillCanonical(ctx, owner, moved.BlockNumber, moved.BlockHash)
	require.ErrorIs(t, err, errOwnerLookup)
	require.Equal(t, Moved, stillCanonical(t, w, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash).State)
}

var errOwnerLookup = errors.New("deposit addresses unreadable")

type failingOwner struct{}

func (failingOwner) Owned(context.Context, []string) ([]string, error) { return nil, errOwnerLookup }

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
	_, err = w.checker.StillCanonical(ctx, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash)
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
			_, err := w.checker.StillCanonical(ctx, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash)
			require.ErrorIs(t, err, payment.ErrUnavailable)
		})
	}
	p.Clear()
	require.Equal(t, Canonical, stillCanonical(t, w, ethDeposit(tx, c.Accounts()[1].Address), tx.BlockNumber, tx.BlockHash).State)
}

// TestMovedKeepsItsLogPosition: a token deposit credited for the log at
// one position of its transaction, found mined again in another block,
// keeps its credit only if the log at that same position still pays it:
// the ledger moves its claim there, so a paying log elsewhere in the
// transaction (a re-execution that emitted its logs in another order) is
// another transfer, free for another report to claim. Without a known
// position, any paying log will do.
func TestMovedKeepsItsLogPosition(t *testing.T) {
	c, _, w := lyingNode(t)
	ctx := testContext(t)
	advanceTo(t, c, 3)
	token, _, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)
	to := c.Accounts()[2].Address
	deposit, err := c.TransferToken(ctx, 0, token, to, big.NewInt(5_000_000))
	require.NoError(t, err)
	// As if credited in the block before, where the transaction's logs
	// were laid out otherwise.
	before, _, err := w.client.BlockTxHashes(ctx, deposit.BlockNumber-1)
	require.NoError(t, err)
	at := func(position *int64) Canonicity {
		d := Deposit{TxHash: deposit.Hash, Token: token, Recipients: []string{to}, Amount: big.NewInt(5_000_000), Index: "7", LogPosition: position}
		return stillCanonical(t, w, d, deposit.BlockNumber-1, before.Hash)
	}
	zero, one := int64(0), int64(1)
	require.Equal(t, Moved, at(nil).State, "no position: any paying log")
	require.Equal(t, Moved, at(&zero).State, "the log at its position pays it")
	gone := at(&one)
	require.Equal(t, Gone, gone.State, "nothing pays it at its position")
	require.Contains(t, gone.Reason, "without the deposit's transfer")
}
