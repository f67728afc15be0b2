package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// lyingWorkers restarts the stack's workers behind a proxy that can hide
// receipts from them, as a lagging backend does; the api keeps asking the
// chain itself.
func (c *chainStack) lyingWorkers(t *testing.T) *devchain.Proxy {
	t.Helper()
	proxy, err := devchain.NewProxy(c.chain.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "worker") {
			p.Stop(10 * time.Second)
		}
	}
	c.StartWorker(map[string]string{"ETH_RPC_URL": proxy.URL()})
	return proxy
}

// notFoundDeposit sends user 2 a final 2 ETH whose receipt the workers'
// node hides, and waits for its deposit id to end failed/not_found.
func (c *chainStack) notFoundDeposit(t *testing.T, proxy *devchain.Proxy, id string) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.chain.SendETH(ctx, 0, addrUser2, wei(2))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tx.BlockNumber))
	proxy.NullReceipt(tx.Hash, devchain.Forever)
	c.deposit(t, id, 2, "ETH", "2", tx.Hash)
	// not_found needs two null reads the delay and a new block apart.
	c.WaitFor("the first absence", 30*time.Second, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND absent_since IS NOT NULL`, id) == 1
	})
	require.NoError(t, c.chain.CommitBlocks(ctx, 1))
	c.waitStatus(t, id, "failed")
	_, outcome, _ := c.event(t, id)
	require.Equal(t, "not_found", outcome)
}

func (c *chainStack) recheck(t *testing.T, id, operator string) map[string]any {
	t.Helper()
	status, body, err := c.client.Admin(http.MethodPost, "/admin/events/"+id+"/recheck", map[string]any{"operator": operator})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
	return body
}

// credited asserts the balance and that the deposit has exactly one
// journal row, of its amount.
func credited(t *testing.T, s *harness.Stack, balance func() string, id, amount string) {
	t.Helper()
	require.Equal(t, amount, balance())
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1`, id))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1 AND amount = $2::numeric`, id, amount))
}

// TestRecheckAgainstTheChain: a deposit that ended not_found because the
// worker's node never showed its transaction is credited, once, when a
// recheck finds it final; a second recheck (api or settlectl) credits
// nothing; a recheck of a mismatch that is still one changes nothing and
// says why. Every recheck is recorded with who asked.
func TestRecheckAgainstTheChain(t *testing.T) {
	c := newChainStack(t, "finalized", map[string]string{"FINALITY_TIMEOUT": "3s", "REORG_RECHECK_DELAY": "1s"})
	proxy := c.lyingWorkers(t)
	ctx := context.Background()

	c.notFoundDeposit(t, proxy, "nf-1")
	require.Equal(t, "0", c.balance(t, 2, "ETH"))

	// The api asks the chain itself. The worker's node still hides the
	// receipt when the recheck runs, so the gate's own look after failing
	// the deposit finds nothing whenever it runs, and only then catches up.
	first := c.recheck(t, "nf-1", "alice")
	proxy.Clear()
	require.Equal(t, "reopened", first["result"], first)
	require.Equal(t, "credit", first["chain_state"])
	require.Equal(t, "alice @127.0.0.1", first["requested_by"])
	c.waitStatus(t, "nf-1", "confirmed")
	credited(t, c.Stack, func() string { return c.balance(t, 2, "ETH") }, "nf-1", "2")

	second := c.recheck(t, "nf-1", "bob")
	require.Equal(t, "not_applicable", second["result"], second)
	require.Equal(t, "confirmed", second["status"])
	out, code := c.Settlectl("events", "recheck", "nf-1", "--operator", "carol")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "not_applicable")
	time.Sleep(time.Second) // a credit in flight would land by now
	credited(t, c.Stack, func() string { return c.balance(t, 2, "ETH") }, "nf-1", "2")
	require.Equal(t, 3, c.Count(`SELECT count(*) FROM event_rechecks WHERE event_id = 'nf-1'`))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM event_rechecks WHERE event_id = 'nf-1' AND requested_by = 'carol' AND result = 'not_applicable'`))
	out, code = c.Settlectl("events", "rechecks", "nf-1")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "alice @127.0.0.1")

	// A token deposit that claims ten times what the chain shows.
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(5_000_000))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tokenTx.BlockNumber))
	c.deposit(t, "mm-1", 2, "TUSD", "50", tokenTx.Hash)
	c.waitStatus(t, "mm-1", "failed")
	_, outcome, _ := c.event(t, "mm-1")
	require.Equal(t, "mismatch", outcome)
	still := c.recheck(t, "mm-1", "alice")
	require.Equal(t, "unchanged", still["result"], still)
	require.Equal(t, "mismatch", still["chain_state"])
	require.Equal(t, "failed", still["status"])
	require.Contains(t, still["detail"], "5000000", "the answer says what the chain shows")
	out, code = c.Settlectl("events", "recheck", "mm-1")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "unchanged")
	require.Contains(t, out, "5000000")
	require.Equal(t, "0", c.balance(t, 2, "TUSD"))
	require.Zero(t, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'mm-1'`))
	requireInvariants(t, c.Stack)
}

// TestAlchemyReaddedTransferCreditsOnce: with an RPC, Alchemy's removed
// makes the chain decide; the worker's node then loses the receipt and,
// past FINALITY_TIMEOUT, once two reads REORG_RECHECK_DELAY and a new
// block apart find it absent, the deposit ends failed/reorged; Alchemy
// adds the transfer again, the deposit is reopened, and once the
// transaction is final it is credited exactly once, whatever Alchemy
// repeats afterwards.
func TestAlchemyReaddedTransferCreditsOnce(t *testing.T) {
	c := newChainStack(t, "finalized", map[string]string{"FINALITY_TIMEOUT": "3s", "REORG_RECHECK_DELAY": "1s"})
	proxy := c.lyingWorkers(t)
	ctx := context.Background()
	tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	eventID := "chain:ETH_MAINNET:" + tx.Hash + ":0"
	add := alchemyTokenPayload(c.token, addrUser1, tx, "0x6acfc0", false)
	removed := alchemyTokenPayload(c.token, addrUser1, tx, "0x6acfc0", true)

	status, body := c.alchemy(t, add)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["accepted"])
	c.WaitFor("receipt seen", 30*time.Second, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND receipt_seen_at IS NOT NULL`, eventID) == 1
	})
	proxy.NullReceipt(tx.Hash, devchain.Forever)
	status, body = c.alchemy(t, removed)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["rechecked"], "the chain decides, not the flag")
	require.EqualValues(t, 0, body["reversed"])
	// One missing receipt is no evidence: the first absence is recorded,
	// and the deposit waits for a second read a block later.
	c.WaitFor("the first absence", 30*time.Second, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND absent_since IS NOT NULL`, eventID) == 1
	})
	waiting, _, _ := c.event(t, eventID)
	require.Contains(t, []string{"awaiting_finality", "enqueued"}, waiting, "not decided on one missing receipt")
	require.NoError(t, c.chain.CommitBlocks(ctx, 1))
	c.waitStatus(t, eventID, "failed")
	_, outcome, _ := c.event(t, eventID)
	require.Equal(t, "reorged", outcome)

	// The worker's node still hides the receipt when Alchemy adds the
	// transfer again, so the gate's own look after failing the deposit
	// finds nothing whenever it runs; it catches up only then.
	require.NoError(t, c.chain.FinalizeThrough(ctx, tx.BlockNumber))
	status, body = c.alchemy(t, add)
	proxy.Clear()
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 0, body["accepted"])
	require.EqualValues(t, 1, body["duplicates"])
	require.EqualValues(t, 1, body["reopened"])
	c.waitStatus(t, eventID, "confirmed")
	credited(t, c.Stack, func() string { return c.balance(t, 1, "TUSD") }, eventID, "7")

	for _, payload := range [][]byte{add, removed, add} {
		status, body = c.alchemy(t, payload)
		require.Equal(t, http.StatusOK, status, body)
		require.EqualValues(t, 0, body["reopened"])
		require.EqualValues(t, 0, body["reversed"])
	}
	time.Sleep(time.Second)
	credited(t, c.Stack, func() string { return c.balance(t, 1, "TUSD") }, eventID, "7")
	require.Zero(t, c.Count(`SELECT count(*) FROM payment_events WHERE event_type = 'reorg_compensation'`),
		"a final deposit reported removed stays credited")
	requireInvariants(t, c.Stack)
}

// removableETHPayload is one native transfer of 3 ETH to the address.
func removableETHPayload(to, txHash string, removed bool) []byte {
	activity := map[string]any{
		"fromAddress": "0x9999999999999999999999999999999999999999", "toAddress": to, "blockNum": "0x10",
		"hash": txHash, "value": 3, "asset": "ETH", "category": "external",
		"rawContract": map[string]any{"rawValue": "0x29a2241af62c0000", "address": nil, "decimals": 18},
	}
	if removed {
		// Alchemy marks a removed native transfer on its log object too.
		activity["log"] = map[string]any{"removed": true, "transactionHash": txHash}
	}
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_test", "id": "whevt_eth", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{activity}},
	})
	return b
}

// TestWithoutRPCTheFlagIsEvidence: an api without ETH_RPC_URL takes
// Alchemy's removed as the evidence (the deposit is voided) and its
// re-add as the evidence back (reopened, credited once); a recheck there
// answers 409 naming ETH_RPC_URL, and settlectl without it says so too.
// Removed once credited, the deposit is compensated; re-added, given back.
func TestWithoutRPCTheFlagIsEvidence(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["ALCHEMY_SIGNING_KEY"] = alchemyKey
	s.Env["POLL_INTERVAL"] = "200ms"
	api := s.StartAPI(nil)
	s.StartScheduler(nil)
	c := &chainStack{Stack: s, client: harness.NewClient(api.URL()), api: api}
	createUsers(t, c.client, 1)
	status, body, err := c.client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addrUser1, "network": "ETH_MAINNET", "user_id": 1})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	txHash := fmt.Sprintf("0x%064x", 0xe7)
	eventID := "chain:ETH_MAINNET:" + txHash + ":native"

	// No worker yet: the removal lands before any credit.
	status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, false))
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["accepted"])
	status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, true))
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["reversed"], body)
	require.EqualValues(t, 0, body["rechecked"])
	_, outcome, _ := c.event(t, eventID)
	require.Equal(t, "reorged", outcome)

	status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, false))
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["reopened"], body)
	s.StartWorker(nil)
	c.waitStatus(t, eventID, "confirmed")
	credited(t, s, func() string { return c.balance(t, 1, "ETH") }, eventID, "3")
	status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, false))
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 0, body["reopened"])

	status, body, err = c.client.Admin(http.MethodPost, "/admin/events/"+eventID+"/recheck", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, status, body)
	require.Equal(t, "conflict", body["code"])
	require.Contains(t, body["error"], "ETH_RPC_URL")
	out, code := s.Settlectl("events", "recheck", eventID)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "ETH_RPC_URL")
	require.Zero(t, s.Count(`SELECT count(*) FROM event_rechecks`), "a recheck that cannot ask the chain records nothing")
	time.Sleep(time.Second)
	credited(t, s, func() string { return c.balance(t, 1, "ETH") }, eventID, "3")
	requireInvariants(t, s)

	// Credited, then removed: compensated. Re-added: given back, once.
	status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, true))
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["reversed"], body)
	c.waitStatus(t, "reorg:"+eventID, "confirmed")
	require.Equal(t, "0", c.balance(t, 1, "ETH"))
	for range 2 {
		status, body = c.alchemy(t, removableETHPayload(addrUser1, txHash, false))
		require.Equal(t, http.StatusOK, status, body)
	}
	c.waitStatus(t, "return:1:"+eventID, "confirmed")
	time.Sleep(time.Second)
	require.Equal(t, "3", c.balance(t, 1, "ETH"))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM payment_events WHERE event_id LIKE 'return:%'`), "given back once")
	requireInvariants(t, s)
}

// TestRecheckHandedToTheWorkers: an api given no RPC settings (the
// contract lists RPC_URL_<NETWORK> and ETH_RPC_URL for worker and
// scheduler) hands a recheck to the workers, which reported an RPC on
// the event's network, and answers with what they recorded: a mismatch
// that is still one stays as it is, a not_found deposit the chain now
// shows final is reopened and credited once.
func TestRecheckHandedToTheWorkers(t *testing.T) {
	c := newChainStack(t, "finalized", map[string]string{"FINALITY_TIMEOUT": "3s", "REORG_RECHECK_DELAY": "1s"})
	proxy := c.lyingWorkers(t)
	ctx := context.Background()
	bare := c.StartAPI(map[string]string{"ETH_RPC_URL": ""})
	client := harness.NewClient(bare.URL())
	recheck := func(id, operator string) map[string]any {
		t.Helper()
		status, body, err := client.Admin(http.MethodPost, "/admin/events/"+id+"/recheck", map[string]any{"operator": operator})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, body)
		return body
	}

	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(5_000_000))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tokenTx.BlockNumber))
	c.deposit(t, "mm-w", 2, "TUSD", "50", tokenTx.Hash)
	c.waitStatus(t, "mm-w", "failed")
	still := recheck("mm-w", "alice")
	require.Equal(t, "unchanged", still["result"], still)
	require.Equal(t, "mismatch", still["chain_state"])
	require.Equal(t, "failed", still["status"])
	require.Equal(t, "alice @127.0.0.1", still["requested_by"])
	require.Contains(t, still["detail"], "5000000", "the answer says what the chain shows")

	c.notFoundDeposit(t, proxy, "nf-w")

	// The gate looks once more right after failing a deposit (and would
	// reopen it itself): wait until the workers' node is asked no more,
	// then let it show the transaction again, so that only the recheck
	// finds it final and unclaimed.
	quiet := proxy.Told("eth_getTransactionReceipt")
	c.WaitFor("the gate's last look", 30*time.Second, func() bool {
		time.Sleep(time.Second)
		now := proxy.Told("eth_getTransactionReceipt")
		stable := now == quiet
		quiet = now
		return stable
	})
	proxy.Clear()
	first := recheck("nf-w", "bob")
	require.Equal(t, "reopened", first["result"], first)
	require.Equal(t, "credit", first["chain_state"])
	c.waitStatus(t, "nf-w", "confirmed")
	credited(t, c.Stack, func() string { return c.balance(t, 2, "ETH") }, "nf-w", "2")
	second := recheck("nf-w", "bob")
	require.Equal(t, "not_applicable", second["result"], second)
	time.Sleep(time.Second) // a credit in flight would land by now
	credited(t, c.Stack, func() string { return c.balance(t, 2, "ETH") }, "nf-w", "2")
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM event_rechecks WHERE event_id = 'nf-w' AND requested_by = 'bob @127.0.0.1'`))

	status, body, err := client.Admin(http.MethodPost, "/admin/events/no-such-event/recheck", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status, body)
	requireInvariants(t, c.Stack)
}
