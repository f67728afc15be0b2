//go:build !fuzzing

package chain

import (
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestScanCalls: the scanner's reads against a real dev chain: the
// finality head per policy, Transfer logs by contract and recipient,
// blocks with their transactions, receipt statuses in one batch, and the
// refusal of traces by a node without the debug API.
func TestScanCalls(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	const to, other = "0x1111111111111111111111111111111111111111", "0x2222222222222222222222222222222222222222"
	tokenTx, err := ch.TransferToken(ctx, 0, token, to, big.NewInt(7_000_000))
	require.NoError(t, err)
	_, err = ch.TransferToken(ctx, 0, token, other, big.NewInt(1))
	require.NoError(t, err)
	ethTx, err := ch.SendETH(ctx, 0, to, big.NewInt(5))
	require.NoError(t, err)
	reverted, err := ch.SendReverting(ctx, 0, token)
	require.NoError(t, err)

	head, err := ch.Head(ctx)
	require.NoError(t, err)
	got, ok, err := client.FinalityHead(ctx, NonePolicy())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, head, got)
	three, err := ConfirmationsPolicy(3)
	require.NoError(t, err)
	got, ok, err = client.FinalityHead(ctx, three)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, head-3, got, "head − N under confirmations:N")
	deep, err := ConfirmationsPolicy(head + 1)
	require.NoError(t, err)
	_, ok, err = client.FinalityHead(ctx, deep)
	require.NoError(t, err)
	require.False(t, ok, "no block is N below the head yet")
	exact, err := ConfirmationsPolicy(head)
	require.NoError(t, err)
	got, ok, err = client.FinalityHead(ctx, exact)
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, got, "head − N is the genesis block")
	require.NoError(t, ch.FinalizeThrough(ctx, head))
	finalized, err := ch.Finalized(ctx)
	require.NoError(t, err)
	got, ok, err = client.FinalityHead(ctx, FinalizedPolicy())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, finalized, got)

	logs, err := client.TransferLogs(ctx, 0, head, []string{token}, []string{to})
	require.NoError(t, err)
	require.Len(t, logs, 1, "only the transfer to the recipient asked about")
	require.Equal(t, tokenTx.Hash, logs[0].TxHash)
	require.Equal(t, to, logs[0].To)
	require.Equal(t, token, logs[0].Contract)
	require.Equal(t, "7000000", logs[0].Value.String())
	require.Equal(t, tokenTx.BlockNumber, logs[0].BlockNumber)
	require.Equal(t, tokenTx.BlockHash, logs[0].BlockHash, "the block the log was read from")

	blocks, err := client.Blocks(ctx, []uint64{ethTx.BlockNumber, reverted.BlockNumber})
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	require.Equal(t, ethTx.BlockNumber, blocks[0].Number)
	require.Len(t, blocks[0].Transactions, 1)
	require.Equal(t, BlockTx{Hash: ethTx.Hash, To: to, Value: big.NewInt(5)}, blocks[0].Transactions[0])

	mined := []MinedTx{
		{Hash: ethTx.Hash, BlockHash: blocks[0].Hash, BlockNumber: blocks[0].Number},
		{Hash: reverted.Hash, BlockHash: blocks[1].Hash, BlockNumber: blocks[1].Number},
	}
	statuses, err := client.ReceiptStatuses(ctx, mined)
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{ethTx.Hash: 1, reverted.Hash: 0}, statuses)
	// A receipt from another block than the pass read (a backend on
	// another fork) is no status: the pass asks again.
	for _, other := range []MinedTx{
		{Hash: reverted.Hash, BlockHash: blocks[0].Hash, BlockNumber: blocks[1].Number},
		{Hash: reverted.Hash, BlockNumber: blocks[1].Number + 1},
	} {
		_, err = client.ReceiptStatuses(ctx, []MinedTx{mined[0], other})
		require.ErrorIs(t, err, ErrOtherFork, "asked as read in %+v", other)
		require.ErrorIs(t, err, payment.ErrUnavailable)
	}
	statuses, err = client.ReceiptStatuses(ctx, []MinedTx{{Hash: reverted.Hash, BlockNumber: blocks[1].Number}})
	require.NoError(t, err, "a trace's transaction is asked by its block's number")
	require.Equal(t, map[string]uint64{reverted.Hash: 0}, statuses)

	_, err = client.Blocks(ctx, []uint64{head + 100})
	require.Error(t, err, "a block past the head is an error, never an empty block")
	_, err = client.TransferLogs(ctx, 5, 4, []string{token}, []string{to})
	require.Error(t, err, "an inverted range")

	// Dev chains serve traces now: TestTracesUnsupported has one without.
	require.NoError(t, client.ProbeTraces(ctx, true))
}

// TestBlockBloomAndLogsByHash: a block's bloom admits the Transfer it
// holds (to its recipient, not to another address) and nothing of a
// token that logged nothing there; asked by the block's hash, the node
// answers that block's logs, and for a hash it does not have, an error,
// never an empty list (what the scanner's lagging-index check rests on).
func TestBlockBloomAndLogsByHash(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	quiet, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	const to, other = "0x1111111111111111111111111111111111111111", "0x2222222222222222222222222222222222222222"
	tx, err := ch.TransferToken(ctx, 0, token, to, big.NewInt(7_000_000))
	require.NoError(t, err)

	blocks, err := client.Blocks(ctx, []uint64{tx.BlockNumber})
	require.NoError(t, err)
	b := blocks[0]
	require.True(t, b.HasBloom)
	require.True(t, b.MayHoldTransfer(token, nil))
	require.True(t, b.MayHoldTransfer(token, []string{other, to}))
	require.False(t, b.MayHoldTransfer(token, []string{other}), "a bloom of one log admits no other recipient")
	require.False(t, b.MayHoldTransfer(quiet, nil), "nor a token that logged nothing in the block")
	require.True(t, Block{}.MayHoldTransfer(quiet, nil), "without a bloom, anything may be there")

	logs, err := client.TransferLogsAt(ctx, b.Hash, []string{token, quiet}, 10)
	require.NoError(t, err)
	require.Len(t, logs, 1)
	require.Equal(t, tx.Hash, logs[0].TxHash)
	require.Equal(t, to, logs[0].To)

	_, err = client.TransferLogsAt(ctx, "0x"+strings.Repeat("ab", 32), []string{token}, 10)
	require.Error(t, err, "a block the node does not have is an error, not an empty answer")
	_, err = client.TransferLogsAt(ctx, "not a hash", []string{token}, 10)
	require.ErrorIs(t, err, payment.ErrInvalid)
}
