package test

import (
	"context"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// superseded tells whether the event's history records a supersede by
// reporter.
func (c *chainStack) superseded(id, reporter string) bool {
	return c.Count(`SELECT count(*) FROM event_rechecks WHERE event_id = $1 AND requested_by = $2 AND detail LIKE 'superseded by %'`, id, reporter) == 1
}

// TestWrongProviderReportSuperseded: a signed Alchemy report of a real
// transfer with the wrong amount (ETH), or the wrong amount and
// recipient (a token), is stored and fails mismatch at finality, moving
// no money; the scanner's report of the true transfer (or, if the scan
// passed the block while the wrong deposit still waited, a rescan of the
// block: the runbook) supersedes it. One event each, credited once with
// the chain's amount to the chain's recipient; one chain_transfers row
// and one journal row each; the replaced content is in the history.
func TestWrongProviderReportSuperseded(t *testing.T) {
	c := newChainStack(t, "finalized", scannerEnv)
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })

	ethTx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	// 1 ETH instead of 2; 2 TUSD to user 2's address instead of 7 to user 1's.
	status, answer := c.alchemy(t, alchemyETHPayload(addrUser1, ethTx, "0xde0b6b3a7640000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	status, answer = c.alchemy(t, alchemyTokenPayload(c.token, addrUser2, tokenTx, "0x1e8480", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	require.Equal(t, "2", c.text(t, `SELECT user_id::text FROM payment_events WHERE event_id = $1`, tokenID(tokenTx)))

	require.NoError(t, c.chain.FinalizeThrough(ctx, tokenTx.BlockNumber))
	ids := []string{nativeID(ethTx), tokenID(tokenTx)}
	for _, id := range ids {
		c.WaitFor(id+" failed mismatch (or already superseded)", time.Minute, func() bool {
			status, outcome, _ := c.event(t, id)
			return status == "failed" && outcome == "mismatch" || c.superseded(id, "scanner")
		})
	}
	c.waitScanned(t, tokenTx.BlockNumber)
	var rescan bool
	for _, id := range ids {
		if status, outcome, _ := c.event(t, id); status == "failed" && outcome == "mismatch" {
			rescan = true
		}
	}
	t.Logf("a rescan was needed: %v", rescan)
	if rescan {
		// The scan met the wrong deposit while it waited: a conflict. The
		// runbook: rescan the block once the deposit failed mismatch.
		status, body, err := c.client.Admin(http.MethodPost, "/admin/rescan",
			map[string]any{"network": "ETH_MAINNET", "from_block": ethTx.BlockNumber, "to_block": tokenTx.BlockNumber})
		require.NoError(t, err)
		require.Equal(t, http.StatusAccepted, status, body)
		c.waitJob(t, body["id"].(string))
	}
	for _, id := range ids {
		c.waitStatus(t, id, "confirmed")
		require.True(t, c.superseded(id, "scanner"), id)
		require.Equal(t, "scanner", c.source(t, id))
	}
	require.True(t, strings.Contains(c.text(t, `SELECT detail FROM event_rechecks WHERE event_id = $1`, tokenID(tokenTx)),
		"was 2 TUSD to "+addrUser2+" of user 2 (stored by alchemy)"))
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	require.Equal(t, "0", c.balance(t, 2, "TUSD"))
	for _, tx := range []string{ethTx.Hash, tokenTx.Hash} {
		require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, tx))
		require.Equal(t, 1, c.Count(`SELECT count(*) FROM chain_transfers WHERE tx_hash = $1`, tx))
	}
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM balance_events`))

	// The wrong report again: a conflict with a credited deposit, nothing
	// changes.
	status, answer = c.alchemy(t, alchemyTokenPayload(c.token, addrUser2, tokenTx, "0x1e8480", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["ignored"], answer)
	require.Nil(t, answer["superseded"], answer)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM balance_events`))
	requireInvariants(t, c.Stack)
}

// TestConflictsWithLiveOrCreditedDepositsStay: a wrong report of a
// transfer whose true deposit waits for finality, and again once it is
// credited, is a conflict: nothing is overwritten, the deposit is
// credited once with its own content, and a second credit never happens.
func TestConflictsWithLiveOrCreditedDepositsStay(t *testing.T) {
	c := newChainStack(t, "finalized", nil)
	ctx := context.Background()
	tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	status, answer := c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tx, "0x6acfc0", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	id := tokenID(tx)

	wrong := alchemyTokenPayload(c.token, addrUser2, tx, "0x1e8480", false)
	conflicts := func() {
		t.Helper()
		status, answer := c.alchemy(t, wrong)
		require.Equal(t, http.StatusOK, status, answer)
		require.EqualValues(t, 1, answer["ignored"], answer)
		require.Nil(t, answer["superseded"], answer)
		require.Equal(t, "1 7", c.text(t, `SELECT user_id::text || ' ' || trim_scale(amount)::text FROM payment_events WHERE event_id = $1`, id))
		require.Zero(t, c.Count(`SELECT count(*) FROM event_rechecks WHERE event_id = $1`, id))
	}
	conflicts() // pending or awaiting finality
	require.NotEqual(t, "confirmed", func() string { s, _, _ := c.event(t, id); return s }())

	require.NoError(t, c.chain.FinalizeThrough(ctx, tx.BlockNumber))
	c.waitStatus(t, id, "confirmed")
	conflicts() // credited
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	require.Equal(t, "0", c.balance(t, 2, "TUSD"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM chain_transfers`))
	page := metricsPage(t, c.api)
	conflict, _ := seriesValue(t, page, "settle_api_webhook_outcomes_total", `outcome="ignored",reason="conflict",source="alchemy"`)
	require.EqualValues(t, 2, conflict)
	requireInvariants(t, c.Stack)
}

// TestRecheckOfAMismatchedProviderReport: a recheck keeps the stored
// content of a provider's wrong report (the chain still contradicts it)
// and its answer points at the rescan that supersedes it.
func TestRecheckOfAMismatchedProviderReport(t *testing.T) {
	c := newChainStack(t, "finalized", nil)
	ctx := context.Background()
	tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	status, answer := c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tx, "0x1e8480", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tx.BlockNumber))
	id := tokenID(tx)
	c.waitStatus(t, id, "failed")
	_, outcome, _ := c.event(t, id)
	require.Equal(t, "mismatch", outcome)
	still := c.recheck(t, id, "alice")
	require.Equal(t, "unchanged", still["result"], still)
	require.Equal(t, "failed", still["status"], still)
	require.Contains(t, still["detail"], fmt.Sprintf("a rescan of block %d supersedes the stored content", tx.BlockNumber), still)
	require.Equal(t, "0", c.balance(t, 1, "TUSD"))
}

// text reads one text value.
func (c *chainStack) text(t *testing.T, query string, args ...any) string {
	t.Helper()
	var v string
	require.NoError(t, c.DB.QueryRow(context.Background(), query, args...).Scan(&v))
	return v
}
