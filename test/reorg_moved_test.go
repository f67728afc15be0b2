package test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMovedThenDroppedIsCompensated: a credited deposit whose transaction
// a first fork mines again in another block keeps its credit and follows
// it there; when a second fork then drops it for good, it is compensated
// once.
func TestMovedThenDroppedIsCompensated(t *testing.T) {
	c := newChainStack(t, "confirmations:1", nil)
	ctx := context.Background()
	first := c.creditWatched(t, "fork-first", 0, 1, addrUser1, 1)
	victim := c.creditWatched(t, "fork-victim", 1, 2, addrUser2, 2)

	// Fork 1 drops the first transaction; the victim's is mined again.
	_, err := c.chain.Reorg(ctx, first.Hash)
	require.NoError(t, err)
	number, hash := receiptBlock(t, c.chain.URL(), victim.Hash)
	require.NotEqual(t, victim.BlockHash, hash)
	c.WaitFor("the evidence moved", 30*time.Second, func() bool { return c.watched(t, "fork-victim").blockHash == hash })
	c.requireCreditKept(t, "fork-victim", 2, "2")

	// Fork 2 drops the victim's transaction where it was mined again.
	_, err = c.chain.Reorg(ctx, victim.Hash)
	require.NoError(t, err)
	c.requireCompensatedOnce(t, "fork-victim", 2, "2")
	require.NotEqual(t, uint64(0), number)
	requireInvariants(t, c.Stack)
}
