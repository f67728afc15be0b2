//go:build !fuzzing

package chain

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// advanceTo seals blocks until the head is exactly head.
func advanceTo(t *testing.T, c *devchain.Chain, head uint64) {
	t.Helper()
	ctx := testContext(t)
	current, err := c.Head(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, current, head, "the chain is past the wanted head already")
	require.NoError(t, c.CommitBlocks(ctx, int(head-current)))
}

func mustPolicy(t *testing.T, s string) Policy {
	t.Helper()
	p, err := ParsePolicy(s)
	require.NoError(t, err)
	return p
}

func check(t *testing.T, w *worker, d Deposit, p Policy) Verdict {
	t.Helper()
	v, err := w.checker.CheckDeposit(testContext(t), d, p)
	require.NoError(t, err)
	return v
}

func ethDeposit(tx devchain.Tx, to string) Deposit {
	return Deposit{TxHash: tx.Hash, Recipients: []string{to}, Amount: big.NewInt(1)}
}

// TestFinalizedPolicyBoundary: a transaction in block 33 waits while the
// finalized block is 32 (the head at 63 included) and is credited once
// the finalized block reaches it; a transaction in block 64, which the
// simulated beacon finalizes as it seals it, is credited at once: the
// boundary is "block <= finalized", inclusive.
func TestFinalizedPolicyBoundary(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	policy := FinalizedPolicy()

	advanceTo(t, c, 32)
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)
	require.EqualValues(t, 33, tx.BlockNumber)

	v := check(t, w, ethDeposit(tx, to), policy)
	require.Equal(t, Verdict{State: Wait, BlockNumber: 33, BlockHash: tx.BlockHash, ReceiptSeen: true, Reason: "block 33 is not finalized yet"}, v)

	advanceTo(t, c, 63)
	finalized, err := c.Finalized(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 32, finalized)
	require.Equal(t, Wait, check(t, w, ethDeposit(tx, to), policy).State)

	advanceTo(t, c, 64)
	v = check(t, w, ethDeposit(tx, to), policy)
	require.Equal(t, Verdict{State: Credit, BlockNumber: 33, BlockHash: tx.BlockHash, Finalized: true, ReceiptSeen: true, Reason: "block 33 is finalized", Transfers: []string{"native"}}, v)

	// Asked again (from the cache now), the answer is the same.
	require.Equal(t, v, check(t, w, ethDeposit(tx, to), policy))

	advanceTo(t, c, 95)
	atEpoch, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)
	require.EqualValues(t, 96, atEpoch.BlockNumber)
	v = check(t, w, ethDeposit(atEpoch, to), policy)
	require.Equal(t, Credit, v.State)
	require.True(t, v.Finalized)
}

// TestConfirmationsPolicyBoundary: confirmations:3 needs latest - block + 1 >= 3.
func TestConfirmationsPolicyBoundary(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	policy := mustPolicy(t, "confirmations:3")

	advanceTo(t, c, 40)
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)
	require.EqualValues(t, 41, tx.BlockNumber)

	v := check(t, w, ethDeposit(tx, to), policy)
	require.Equal(t, Wait, v.State)
	require.True(t, v.ReceiptSeen)
	require.Equal(t, "block 41 has 1 of 3 confirmations", v.Reason)

	advanceTo(t, c, 42)
	require.Equal(t, "block 41 has 2 of 3 confirmations", check(t, w, ethDeposit(tx, to), policy).Reason)

	advanceTo(t, c, 43)
	v = check(t, w, ethDeposit(tx, to), policy)
	require.Equal(t, Verdict{State: Credit, BlockNumber: 41, BlockHash: tx.BlockHash, ReceiptSeen: true, Reason: "block 41 has 3 confirmations (policy confirmations:3)", Transfers: []string{"native"}}, v)
	require.False(t, v.Finalized, "credited before finality: the ledger must watch it")

	seen, err := w.checker.StillCanonical(ctx, ethDeposit(tx, to), tx.BlockNumber, tx.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Canonical, seen.State)

	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	v = check(t, w, ethDeposit(tx, to), policy)
	require.Equal(t, Credit, v.State)
	require.True(t, v.Finalized)
	seen, err = w.checker.StillCanonical(ctx, ethDeposit(tx, to), tx.BlockNumber, tx.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Canonicity{State: Final, BlockNumber: tx.BlockNumber, BlockHash: tx.BlockHash, Final: true, Reason: "block 41 is finalized"}, seen)
}

func TestNonePolicyCreditsAtOnce(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	advanceTo(t, c, 1)
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)

	v := check(t, w, ethDeposit(tx, to), NonePolicy())
	require.Equal(t, Credit, v.State)
	require.False(t, v.Finalized)
	require.Equal(t, tx.BlockHash, v.BlockHash)
}

// TestUnknownTransactionWaits: no receipt is a Wait. Until geth's
// transaction indexer has finished (on a fresh chain, for a moment), a
// missing receipt proves nothing and the answer is ErrTxIndexing, an
// ErrUnavailable that does not count against the breaker.
func TestUnknownTransactionWaits(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	unknown := Deposit{TxHash: "0x" + strings.Repeat("ab", 32), Recipients: []string{"0x" + strings.Repeat("cd", 20)}, Amount: big.NewInt(1)}
	sawIndexing := false
	require.Eventually(t, func() bool {
		_, err := w.checker.CheckDeposit(testContext(t), unknown, FinalizedPolicy())
		if err != nil {
			require.ErrorIs(t, err, ErrTxIndexing)
			require.ErrorIs(t, err, payment.ErrUnavailable)
			sawIndexing = true
			require.NoError(t, c.CommitBlocks(testContext(t), 1))
		}
		return err == nil
	}, testTimeout, testPollInterval)
	t.Logf("indexer still running at first: %v", sawIndexing)
	for _, p := range []Policy{FinalizedPolicy(), NonePolicy(), mustPolicy(t, "confirmations:1")} {
		v := check(t, w, unknown, p)
		require.Equal(t, Wait, v.State)
		require.False(t, v.ReceiptSeen)
		require.Contains(t, v.Reason, "no receipt")
	}
	require.Zero(t, metricValue(t, w.client.metrics.errors.WithLabelValues(methodReceipt)), "not found and indexing are answers, not errors")
}

// TestRevertedNeverCredited: status 0 is Reverted once the policy holds,
// and only a Wait before: a receipt in a block that can still be reorged
// is not the last word.
func TestRevertedNeverCredited(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	token, _, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)
	tx, err := c.SendReverting(ctx, 0, token)
	require.NoError(t, err)
	require.EqualValues(t, 0, tx.Status)

	d := Deposit{TxHash: tx.Hash, Token: token, Recipients: []string{c.Accounts()[1].Address}, Amount: big.NewInt(5)}
	v := check(t, w, d, mustPolicy(t, "confirmations:1"))
	require.Equal(t, Reverted, v.State)
	require.Equal(t, "transaction reverted (receipt status 0) in block "+itoa(tx.BlockNumber), v.Reason)

	v = check(t, w, d, FinalizedPolicy())
	require.Equal(t, Wait, v.State)
	require.True(t, v.ReceiptSeen)
	require.Contains(t, v.Reason, "reverted")

	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	v = check(t, w, d, FinalizedPolicy())
	require.Equal(t, Reverted, v.State)
	require.True(t, v.Finalized)
	// A native ETH deposit naming the reverted transaction: the same.
	require.Equal(t, Reverted, check(t, w, Deposit{TxHash: tx.Hash, Recipients: []string{token}, Amount: big.NewInt(1)}, FinalizedPolicy()).State)
}

func TestTokenDeposits(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	accounts := c.Accounts()
	deposit, other := accounts[1].Address, accounts[2].Address
	token, creation, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)
	foreign, _, err := c.DeployToken(ctx, 0)
	require.NoError(t, err)

	amount, ok := new(big.Int).SetString("50000000000000000000", 10) // 50 * 10^18
	require.True(t, ok)
	good, err := c.TransferToken(ctx, 0, token, deposit, amount)
	require.NoError(t, err)
	viaForeign, err := c.TransferToken(ctx, 0, foreign, deposit, amount)
	require.NoError(t, err)
	toOther, err := c.TransferToken(ctx, 0, token, other, amount)
	require.NoError(t, err)
	plainETH, err := c.SendETH(ctx, 0, deposit, amount)
	require.NoError(t, err)
	policy := mustPolicy(t, "confirmations:1")

	// Recipients may be given in any case; a second deposit address of the
	// user is fine.
	v := check(t, w, Deposit{TxHash: good.Hash, Token: "0x" + strings.ToUpper(token[2:]), Recipients: []string{other, strings.ToUpper(deposit)}, Amount: amount}, policy)
	require.Equal(t, Credit, v.State, v.Reason)

	cases := []struct {
		name   string
		d      Deposit
		reason string
	}{
		{
			name:   "wrong amount",
			d:      Deposit{TxHash: good.Hash, Token: token, Recipients: []string{deposit}, Amount: new(big.Int).Add(amount, big.NewInt(1))},
			reason: "Transfer log of " + token + " to " + deposit + " carries 50000000000000000000 base units, the deposit says 50000000000000000001",
		},
		{
			name:   "wrong recipient",
			d:      Deposit{TxHash: toOther.Hash, Token: token, Recipients: []string{deposit}, Amount: amount},
			reason: "no Transfer log of " + token + " to " + deposit + " (its Transfer logs go to " + other + ")",
		},
		{
			name:   "foreign contract",
			d:      Deposit{TxHash: viaForeign.Hash, Token: token, Recipients: []string{deposit}, Amount: amount},
			reason: "no Transfer log from token contract " + token + " (the receipt's Transfer logs come from " + foreign + ")",
		},
		{
			name:   "no transfer at all",
			d:      Deposit{TxHash: plainETH.Hash, Token: token, Recipients: []string{deposit}, Amount: amount},
			reason: "the receipt has no ERC-20 Transfer log",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := check(t, w, tc.d, policy)
			require.Equal(t, Mismatch, v.State)
			require.Equal(t, tc.reason, v.Reason)
			require.True(t, v.ReceiptSeen)
		})
	}

	// A native deposit is held against the transaction itself: its
	// recipient and its value.
	require.Equal(t, Credit, check(t, w, Deposit{TxHash: plainETH.Hash, Recipients: []string{other, strings.ToUpper(deposit)}, Amount: amount}, policy).State)
	for name, tc := range map[string]struct {
		d      Deposit
		reason string
	}{
		"native amount": {
			d:      Deposit{TxHash: plainETH.Hash, Recipients: []string{deposit}, Amount: new(big.Int).Add(amount, big.NewInt(1))},
			reason: "the transaction carries 50000000000000000000 base units, the deposit says 50000000000000000001",
		},
		"native recipient": {
			d:      Deposit{TxHash: plainETH.Hash, Recipients: []string{other}, Amount: amount},
			reason: "the transaction pays " + strings.ToLower(deposit) + ", not " + strings.ToLower(other),
		},
		"native claimed from a token transfer": {
			d:      Deposit{TxHash: good.Hash, Recipients: []string{deposit}, Amount: amount},
			reason: "the transaction pays " + token + ", not " + strings.ToLower(deposit),
		},
		"native claimed from a contract creation": {
			d:      Deposit{TxHash: creation.Hash, Recipients: []string{deposit}, Amount: amount},
			reason: "the transaction creates a contract; it pays no deposit address",
		},
	} {
		t.Run(name, func(t *testing.T) {
			v := check(t, w, tc.d, policy)
			require.Equal(t, Mismatch, v.State)
			require.Equal(t, tc.reason, v.Reason)
		})
	}
	// With no deposit address known (a user who registered none), the
	// value is still checked.
	require.Equal(t, Credit, check(t, w, Deposit{TxHash: plainETH.Hash, Amount: amount}, policy).State)
	require.Equal(t, Mismatch, check(t, w, Deposit{TxHash: plainETH.Hash, Amount: big.NewInt(1)}, policy).State)
	// Value moved by a contract call is checked in the call trace (see
	// TestInternalDeposits): the token's transfer makes no call below it.
	internal := check(t, w, Deposit{TxHash: good.Hash, Internal: true, Index: "trace:CALL_0", Recipients: []string{deposit}, Amount: amount}, policy)
	require.Equal(t, Mismatch, internal.State)
	require.Equal(t, "the transaction's call trace has no frame call_0", internal.Reason)
}

func TestInvalidDeposits(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{})
	hash := "0x" + strings.Repeat("ab", 32)
	addr := "0x" + strings.Repeat("cd", 20)
	for name, d := range map[string]Deposit{
		"bad hash":           {TxHash: "0x12"},
		"bad token":          {TxHash: hash, Token: "usdc", Recipients: []string{addr}, Amount: big.NewInt(1)},
		"bad recipient":      {TxHash: hash, Recipients: []string{"0xnothex"}},
		"token no recipient": {TxHash: hash, Token: addr, Amount: big.NewInt(1)},
		"token no amount":    {TxHash: hash, Token: addr, Recipients: []string{addr}},
		"native no amount":   {TxHash: hash, Recipients: []string{addr}},
		"token zero amount":  {TxHash: hash, Token: addr, Recipients: []string{addr}, Amount: big.NewInt(0)},
		"too many":           {TxHash: hash, Recipients: make([]string, RecipientsMax+1)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := w.checker.CheckDeposit(testContext(t), d, FinalizedPolicy())
			require.ErrorIs(t, err, payment.ErrInvalid)
		})
	}
	_, err := w.checker.CheckDeposit(testContext(t), Deposit{TxHash: hash}, Policy{})
	require.ErrorIs(t, err, payment.ErrInvalid)
	_, err = w.checker.StillCanonical(testContext(t), Deposit{TxHash: hash, Amount: big.NewInt(1)}, 1, "0x12")
	require.ErrorIs(t, err, payment.ErrInvalid)
}

// TestReorgDropsDeposit: a real reorg (the simulated backend's fork)
// drops a credited transaction. CheckDeposit no longer sees a receipt,
// StillCanonical says Gone, and a transaction of the dropped blocks that
// the new branch mined again is Moved from its old block to the new one.
func TestReorgDropsDeposit(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	accounts := c.Accounts()
	to := accounts[2].Address
	policy := mustPolicy(t, "confirmations:1")
	advanceTo(t, c, 3)

	dropped, err := c.SendETH(ctx, 0, to, big.NewInt(1_000))
	require.NoError(t, err)
	moved, err := c.SendETH(ctx, 1, to, big.NewInt(2_000))
	require.NoError(t, err)

	v := check(t, w, Deposit{TxHash: dropped.Hash, Recipients: []string{to}, Amount: big.NewInt(1_000)}, policy)
	require.Equal(t, Credit, v.State)
	require.False(t, v.Finalized)
	seen, err := w.checker.StillCanonical(ctx, paid(dropped, to, 1_000), v.BlockNumber, v.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Canonical, seen.State)

	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)

	v = check(t, w, Deposit{TxHash: dropped.Hash, Recipients: []string{to}, Amount: big.NewInt(1_000)}, policy)
	require.Equal(t, Wait, v.State)
	require.False(t, v.ReceiptSeen)
	seen, err = w.checker.StillCanonical(ctx, paid(dropped, to, 1_000), dropped.BlockNumber, dropped.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Gone, seen.State)

	again := check(t, w, Deposit{TxHash: moved.Hash, Recipients: []string{to}, Amount: big.NewInt(2_000)}, policy)
	require.Equal(t, Credit, again.State, "the other transaction was mined again on the new branch")
	require.NotEqual(t, moved.BlockHash, again.BlockHash)
	seen, err = w.checker.StillCanonical(ctx, paid(moved, to, 2_000), moved.BlockNumber, moved.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Moved, seen.State, "its block changed")
	require.Equal(t, again.BlockNumber, seen.BlockNumber)
	require.Equal(t, again.BlockHash, seen.BlockHash)
	seen, err = w.checker.StillCanonical(ctx, paid(moved, to, 2_000), again.BlockNumber, again.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Canonical, seen.State)
}

// TestStaleReceiptIsNotCredited: a fork drops a token deposit's
// transaction and the chain finalizes past its old height. One backend
// still behind the fork serves the old receipt once: its height is below
// finalized, but the header there has another hash, so the deposit waits
// (nothing credited, nothing cached) and the honest node decides next.
func TestStaleReceiptIsNotCredited(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[2].Address
	advanceTo(t, c, 3)
	token, _, err := c.DeployToken(ctx, 1)
	require.NoError(t, err)
	dropped, err := c.TransferToken(ctx, 0, token, to, big.NewInt(7_000_000))
	require.NoError(t, err)
	stale := rawReceipt(t, c.URL(), dropped.Hash)
	_, err = c.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)
	head, err := c.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, c.FinalizeThrough(ctx, head))
	d := Deposit{TxHash: dropped.Hash, Token: token, Recipients: []string{to}, Amount: big.NewInt(7_000_000)}
	require.Equal(t, Wait, check(t, w, d, FinalizedPolicy()).State, "the honest node has no receipt")

	p.Answer("eth_getTransactionReceipt", dropped.Hash, stale, 1)
	v := check(t, w, d, FinalizedPolicy())
	require.Equal(t, Wait, v.State, "a receipt of a block the chain no longer has credited the deposit (Finalized=%v)", v.Finalized)
	require.False(t, v.ReceiptSeen)
	require.Contains(t, v.Reason, fmt.Sprintf("the receipt names block %d %s, the chain has", dropped.BlockNumber, dropped.BlockHash))

	// Nothing was cached: the honest node answers again.
	require.Equal(t, Wait, check(t, w, d, FinalizedPolicy()).State)
	require.EqualValues(t, 2, p.Calls("eth_getTransactionReceipt")-p.Told("eth_getTransactionReceipt"), "both later checks asked the node")
	seen := stillCanonical(t, w, d, dropped.BlockNumber, dropped.BlockHash)
	require.Equal(t, Gone, seen.State)
}

// TestTerminalVerdictNeedsTheReceiptBlock: before a terminal verdict the
// header at the receipt's height is asked; a node without that block, or
// answering garbage, is unavailable, never a verdict. A Wait asks nothing
// more.
func TestTerminalVerdictNeedsTheReceiptBlock(t *testing.T) {
	c, p, w := lyingNode(t)
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	advanceTo(t, c, 2)
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)
	atHeight := fmt.Sprintf("0x%x", tx.BlockNumber)

	before := p.Calls("eth_getBlockByNumber")
	require.Equal(t, Wait, check(t, w, ethDeposit(tx, to), FinalizedPolicy()).State)
	require.EqualValues(t, 1, p.Calls("eth_getBlockByNumber")-before, "a Wait reads the finalized header only")

	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	for name, lie := range map[string]json.RawMessage{
		"no block at the receipt's height": json.RawMessage("null"),
		"garbage header there":             json.RawMessage(`"not a block"`),
	} {
		t.Run(name, func(t *testing.T) {
			p.Clear()
			p.Answer("eth_getBlockByNumber", atHeight, lie, 1)
			v, err := w.checker.CheckDeposit(ctx, ethDeposit(tx, to), FinalizedPolicy())
			require.ErrorIs(t, err, payment.ErrUnavailable, "got %s (%s)", v.State, v.Reason)
		})
	}
	p.Clear()
	before = p.Calls("eth_getBlockByNumber")
	v := check(t, w, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, Credit, v.State)
	require.EqualValues(t, 2, p.Calls("eth_getBlockByNumber")-before, "finalized, then the receipt's block")
	before = p.Calls("eth_getBlockByNumber")
	require.Equal(t, Credit, check(t, w, ethDeposit(tx, to), FinalizedPolicy()).State)
	require.EqualValues(t, 0, p.Calls("eth_getBlockByNumber")-before, "from the final cache")
}

func itoa(n uint64) string { return new(big.Int).SetUint64(n).String() }

// TestTwoIdenticalTransferLogs: a transaction paying one address twice
// the same amount offers both logs, in log order, to be claimed one each.
// A deposit naming one gets that one first and the other after it: a
// named index is a label from the block its reporter saw, which a fork
// may have shifted onto the twin or onto no log of the transaction at
// all (the soak's seed 4701253035119547 lost a credit when only the named
// log was offered and the twin's claim, followed to the new block, sat
// on it).
func TestTwoIdenticalTransferLogs(t *testing.T) {
	token, to := "0x"+strings.Repeat("1", 40), "0x"+strings.Repeat("2", 40)
	logs := []Transfer{
		{Contract: token, To: to, Value: big.NewInt(10), LogIndex: 3},
		{Contract: token, To: "0x" + strings.Repeat("3", 40), Value: big.NewInt(10), LogIndex: 4},
		{Contract: token, To: to, Value: big.NewInt(10), LogIndex: 5},
		{Contract: token, To: to, Value: big.NewInt(11), LogIndex: 6},
	}
	d := Deposit{Token: token, Recipients: []string{to}, Amount: big.NewInt(10)}
	matches, why := matchTransfer(d, logs)
	require.Equal(t, []string{"3", "5"}, matches, why)
	for index, want := range map[string][]string{
		"5": {"5", "3"}, // the named log first
		"3": {"3", "5"},
		"4": {"3", "5"}, // the named log pays another address
		"6": {"3", "5"}, // the named log carries another amount
		"9": {"3", "5"}, // no log of the transaction has the index
	} {
		d.Index = index
		matches, why = matchTransfer(d, logs)
		require.Equal(t, want, matches, "index %s: %s", index, why)
	}
	d.Index, d.Amount = "5", big.NewInt(12)
	matches, why = matchTransfer(d, logs)
	require.Empty(t, matches)
	require.Contains(t, why, "carries 10, 10, 11 base units")
	require.Contains(t, why, "names log 5")
	d.Index, d.Amount = "native", big.NewInt(10)
	matches, why = matchTransfer(d, logs)
	require.Empty(t, matches)
	require.Contains(t, why, "not a log index")
}
