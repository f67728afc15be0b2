package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
)

func alchemyETHPayload(to string, tx devchain.Tx, rawValue string) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_test", "id": "whevt_eth_" + tx.Hash[2:14], "createdAt": time.Now().UTC().Format(time.RFC3339),
		"type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{map[string]any{
			"fromAddress": "0x9999999999999999999999999999999999999999", "toAddress": to,
			"blockNum": fmt.Sprintf("0x%x", tx.BlockNumber), "hash": tx.Hash, "value": 2, "asset": "ETH", "category": "external",
			"rawContract": map[string]any{"rawValue": rawValue, "address": nil, "decimals": 18},
		}}},
	})
	return b
}

// eventsOf lists the events naming a transaction as id=status/outcome.
func (c *chainStack) eventsOf(t *testing.T, txHash string) map[string]string {
	return c.pairs(t, `SELECT event_id, status || '/' || COALESCE(outcome, '') FROM payment_events WHERE tx_hash = $1`, txHash)
}

// claimsOf lists a transaction's chain_transfers as event id=index.
func (c *chainStack) claimsOf(t *testing.T, txHash string) map[string]string {
	return c.pairs(t, `SELECT event_id, transfer_index FROM chain_transfers WHERE tx_hash = $1`, txHash)
}

// pairs maps the first column of a query's rows to the second.
func (c *chainStack) pairs(t *testing.T, query string, args ...any) map[string]string {
	t.Helper()
	rows, err := c.DB.Query(context.Background(), query, args...)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		out[k] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// TestOneTransferTwoReporters: a real ETH transfer and a real ERC-20
// transfer, each reported by /webhook/payments under its own id and by
// Alchemy, in both orders: one credit each; the other event ends
// duplicate_transfer; invariants 1–5 hold.
func TestOneTransferTwoReporters(t *testing.T) {
	c := newChainStack(t, "finalized", nil)
	ctx := context.Background()
	ethTx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tokenTx.BlockNumber))

	// ETH: the payments webhook first, then Alchemy.
	c.deposit(t, "own-eth", 1, "ETH", "2", ethTx.Hash)
	c.waitStatus(t, "own-eth", "confirmed")
	status, answer := c.alchemy(t, alchemyETHPayload(addrUser1, ethTx, "0x1bc16d674ec80000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], "a new event: its id is the transfer's, not the payments one")

	// The token: Alchemy first, then the payments webhook.
	status, answer = c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tokenTx, "0x6acfc0", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"])
	tokenID := "chain:ETH_MAINNET:" + tokenTx.Hash + ":0"
	c.waitStatus(t, tokenID, "confirmed")
	c.deposit(t, "own-token", 1, "TUSD", "7", tokenTx.Hash)

	ethID := "chain:ETH_MAINNET:" + ethTx.Hash + ":native"
	c.waitStatus(t, ethID, "failed")
	c.waitStatus(t, "own-token", "failed")
	require.Equal(t, map[string]string{"own-eth": "confirmed/success", ethID: "failed/duplicate_transfer"}, c.eventsOf(t, ethTx.Hash))
	require.Equal(t, map[string]string{tokenID: "confirmed/success", "own-token": "failed/duplicate_transfer"}, c.eventsOf(t, tokenTx.Hash))
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM chain_transfers`))
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM dead_letter_queue`))

	// Redelivered by both, nothing changes.
	c.deposit(t, "own-eth", 1, "ETH", "2", ethTx.Hash)
	status, answer = c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tokenTx, "0x6acfc0", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 0, answer["accepted"])
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	requireInvariants(t, c.Stack)
}

// TestTransferIndexOnPayments: a payments deposit may name its transfer;
// a malformed index, or one without a transaction, is a 400 and stores
// nothing.
func TestTransferIndexOnPayments(t *testing.T) {
	c := newChainStack(t, "confirmations:1", nil)
	ctx := context.Background()
	tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(3_000_000))
	require.NoError(t, err)
	for _, bad := range []map[string]any{
		{"event_id": "bad-index", "event_type": "deposit", "user_id": 2, "asset": "TUSD", "amount": "3", "tx_hash": tx.Hash, "transfer_index": "-1"},
		{"event_id": "bad-index", "event_type": "deposit", "user_id": 2, "asset": "TUSD", "amount": "3", "tx_hash": tx.Hash, "transfer_index": 0},
		{"event_id": "bad-index", "event_type": "deposit", "user_id": 2, "asset": "TUSD", "amount": "3", "transfer_index": "0"},
		{"event_id": "bad-index", "event_type": "withdrawal", "user_id": 2, "asset": "TUSD", "amount": "3", "tx_hash": tx.Hash, "transfer_index": "0"},
	} {
		body, _ := json.Marshal(bad)
		status, resp, err := c.client.Webhook(body)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, status, resp)
	}
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`))

	// The named log first: log 0 is named-right's. Log 1 does not exist
	// in that receipt, which a fork's shifted index looks like, so
	// named-wrong is offered the transaction's paying log, which is held:
	// one transfer, one credit.
	post := func(id, index, amount string) {
		body, _ := json.Marshal(map[string]any{"event_id": id, "event_type": "deposit", "user_id": 2, "asset": "TUSD", "amount": amount, "tx_hash": tx.Hash, "transfer_index": index})
		status, resp, err := c.client.Webhook(body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, resp)
	}
	post("named-right", "0", "3")
	c.waitStatus(t, "named-right", "confirmed")
	post("named-wrong", "1", "3")
	c.waitStatus(t, "named-wrong", "failed")
	_, outcome, _ := c.event(t, "named-wrong")
	require.Equal(t, "duplicate_transfer", outcome)
	// No log pays 4: a mismatch that says what the log carries.
	post("named-more", "0", "4")
	c.waitStatus(t, "named-more", "failed")
	_, outcome, reason := c.event(t, "named-more")
	require.Equal(t, "mismatch", outcome)
	require.Contains(t, reason, "carries 3000000 base units")
	require.Contains(t, reason, "names log 0")
	require.Equal(t, "3", c.balance(t, 2, "TUSD"))
	require.Equal(t, map[string]string{"named-right": "0"}, c.claimsOf(t, tx.Hash))

	// A label no log of the transaction has, alone: the paying log is
	// its transfer, and that transfer's own report is the duplicate.
	other, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(2_000_000))
	require.NoError(t, err)
	body, _ := json.Marshal(map[string]any{"event_id": "shifted", "event_type": "deposit", "user_id": 2, "asset": "TUSD", "amount": "2", "tx_hash": other.Hash, "transfer_index": "5"})
	status, resp, err := c.client.Webhook(body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, resp)
	c.waitStatus(t, "shifted", "confirmed")
	status, answer := c.alchemy(t, alchemyTokenPayload(c.token, addrUser2, other, "0x1e8480", false))
	require.Equal(t, http.StatusOK, status, answer)
	otherID := "chain:ETH_MAINNET:" + other.Hash + ":0"
	c.waitStatus(t, otherID, "failed")
	require.Equal(t, map[string]string{"shifted": "confirmed/success", otherID: "failed/duplicate_transfer"}, c.eventsOf(t, other.Hash))
	require.Equal(t, map[string]string{"shifted": "0"}, c.claimsOf(t, other.Hash))
	require.Equal(t, "5", c.balance(t, 2, "TUSD"))
	requireInvariants(t, c.Stack)
}

// TestTransferRaceAcrossWorkers: ten events naming one real transfer,
// delivered at once and settled by two worker processes: one credit.
func TestTransferRaceAcrossWorkers(t *testing.T) {
	c := newChainStack(t, "confirmations:1", map[string]string{"TASK_EVENTS_MAX": "1"})
	c.StartWorker(nil)
	ctx := context.Background()
	tx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(5))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"event_id": fmt.Sprintf("race-%d", i), "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "5", "tx_hash": tx.Hash})
			status, resp, err := c.client.Webhook(body)
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, status, resp)
		}()
	}
	wg.Wait()
	c.WaitFor("all ten terminal", time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1 AND status IN ('confirmed', 'failed')`, tx.Hash) == 10
	})
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1 AND status = 'confirmed'`, tx.Hash))
	require.Equal(t, 9, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1 AND outcome = 'duplicate_transfer'`, tx.Hash))
	require.Equal(t, "5", c.balance(t, 1, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "worker") {
			t.Logf("%s checked %d of the deposits", p.Name, strings.Count(p.Logs(), "deposit passes the finality policy"))
		}
	}
	requireInvariants(t, c.Stack)
}
