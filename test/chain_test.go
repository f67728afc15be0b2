package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// Deposit addresses of the chain tests (any well-formed address works: the
// dev chain sends to it and settle maps it to a user).
const (
	addrUser1 = "0x1111111111111111111111111111111111111111"
	addrUser2 = "0x2222222222222222222222222222222222222222"
)

// chainStack is a settle installation whose worker asks a real dev chain
// (go-ethereum's simulated backend over HTTP JSON-RPC).
type chainStack struct {
	*harness.Stack
	chain  *devchain.Chain
	token  string
	client *harness.Client
	api    *harness.Proc
	worker *harness.Proc
}

func newChainStack(t *testing.T, finality string, extra map[string]string) *chainStack {
	t.Helper()
	ctx := context.Background()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)

	s := harness.NewStack(t)
	// The token must be in the registry before api and worker load it.
	_, err = s.DB.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('TUSD', 'ETH_MAINNET', $1, 6)`, strings.ToLower(token))
	require.NoError(t, err)
	s.Env["ETH_RPC_URL"] = ch.URL()
	s.Env["DEPOSIT_FINALITY"] = finality
	s.Env["ALCHEMY_SIGNING_KEY"] = alchemyKey
	s.Env["POLL_INTERVAL"] = "200ms"
	s.Env["FINALITY_RECHECK_MIN"] = "100ms"
	s.Env["FINALITY_RECHECK_MAX"] = "500ms"
	s.Env["FINALITY_HINT_TTL"] = "50ms"
	s.Env["REORG_WATCH_INTERVAL"] = "300ms"
	// The chain scanner only where a test asks for it (test/scanner_test.go).
	s.Env["SCAN_INTERVAL"] = "off"
	for k, v := range extra {
		s.Env[k] = v
	}
	api := s.StartAPI(nil)
	worker := s.StartWorker(nil)
	s.StartScheduler(nil)
	c := &chainStack{Stack: s, chain: ch, token: strings.ToLower(token), client: harness.NewClient(api.URL()), api: api, worker: worker}
	createUsers(t, c.client, 1, 2)
	for user, addr := range map[int64]string{1: addrUser1, 2: addrUser2} {
		status, body, err := c.client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addr, "network": "ETH_MAINNET", "user_id": user})
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, body)
	}
	return c
}

const alchemyKey = "whsec_test-alchemy-signing-key-0123456789"

// deposit posts a signed /webhook/payments deposit naming a transaction.
func (c *chainStack) deposit(t *testing.T, id string, user int64, asset, amount, txHash string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"event_id": id, "event_type": "deposit", "user_id": user, "asset": asset, "amount": amount, "tx_hash": txHash})
	status, resp, err := c.client.Webhook(body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, resp)
}

func (c *chainStack) event(t *testing.T, id string) (status, outcome, reason string) {
	t.Helper()
	var o, r *string
	require.NoError(t, c.DB.QueryRow(context.Background(), `SELECT status, outcome, error FROM payment_events WHERE event_id = $1`, id).Scan(&status, &o, &r))
	if o != nil {
		outcome = *o
	}
	if r != nil {
		reason = *r
	}
	return status, outcome, reason
}

func (c *chainStack) balance(t *testing.T, user int64, asset string) string {
	t.Helper()
	var b string
	require.NoError(t, c.DB.QueryRow(context.Background(), `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id=$1 AND asset=$2), '0')`, user, asset).Scan(&b))
	return decimal.RequireFromString(b).String()
}

func (c *chainStack) waitStatus(t *testing.T, id, want string) {
	t.Helper()
	c.WaitFor(id+" "+want, time.Minute, func() bool {
		status, _, _ := c.event(t, id)
		return status == want
	})
}

func wei(eth int64) *big.Int {
	return new(big.Int).Mul(big.NewInt(eth), big.NewInt(1_000_000_000_000_000_000))
}

// TestDepositWaitsForFinality: a mined but not finalized deposit waits,
// visibly, without burning retries; once the finalized tag passes its
// block it is credited exactly once.
func TestDepositWaitsForFinality(t *testing.T) {
	c := newChainStack(t, "finalized", nil)
	ctx := context.Background()
	tx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	c.deposit(t, "fin-1", 1, "ETH", "2", tx.Hash)

	c.waitStatus(t, "fin-1", "awaiting_finality")
	status, body, err := c.client.Read("/v1/events/fin-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "awaiting_finality", body["status"], "the wait is visible through the API")
	require.NotNil(t, body["finality"])
	// Several re-checks pass while the block is not final; none costs a retry.
	c.WaitFor("re-checks", 30*time.Second, func() bool {
		var checks int
		_ = c.DB.QueryRow(ctx, `SELECT check_count FROM payment_events WHERE event_id='fin-1'`).Scan(&checks)
		return checks >= 3
	})
	require.Equal(t, "0", c.balance(t, 1, "ETH"))
	require.Equal(t, 0, c.Count(`SELECT retry_count FROM payment_events WHERE event_id='fin-1'`))

	require.NoError(t, c.chain.FinalizeThrough(ctx, tx.BlockNumber))
	c.waitStatus(t, "fin-1", "confirmed")
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id='fin-1'`))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_id='fin-1' AND block_number = $1 AND chain_state = 'final'`, int64(tx.BlockNumber)))
	requireInvariants(t, c.Stack)
}

// TestChainRefusalsSayWhy: a reverted transaction, a token deposit whose
// Transfer log does not match, and an ETH deposit whose transaction pays
// another amount or another user's address are never credited, and the
// event records why.
func TestChainRefusalsSayWhy(t *testing.T) {
	c := newChainStack(t, "confirmations:1", nil)
	ctx := context.Background()
	reverted, err := c.chain.SendReverting(ctx, 0, c.token)
	require.NoError(t, err)
	require.Zero(t, reverted.Status)
	c.deposit(t, "rev-1", 1, "ETH", "1", reverted.Hash)

	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(5_000_000)) // 5 TUSD
	require.NoError(t, err)
	c.deposit(t, "mis-1", 2, "TUSD", "50", tokenTx.Hash) // claims 50
	c.deposit(t, "ok-1", 2, "TUSD", "5", tokenTx.Hash)   // the same transfer told truthfully, under another id

	// Native ETH is held against the transaction itself: its value and
	// its recipient (user 1's deposit address, not user 2's).
	ethTx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	c.deposit(t, "eth-more", 1, "ETH", "5", ethTx.Hash)
	c.deposit(t, "eth-other-user", 2, "ETH", "2", ethTx.Hash)
	c.deposit(t, "eth-ok", 1, "ETH", "2", ethTx.Hash)

	c.waitStatus(t, "rev-1", "failed")
	_, outcome, reason := c.event(t, "rev-1")
	require.Equal(t, "reverted", outcome)
	require.Contains(t, reason, "revert")
	c.waitStatus(t, "mis-1", "failed")
	_, outcome, reason = c.event(t, "mis-1")
	require.Equal(t, "mismatch", outcome)
	require.Contains(t, reason, "5000000", "the reason names what the chain says")
	c.waitStatus(t, "ok-1", "confirmed")
	c.waitStatus(t, "eth-more", "failed")
	_, outcome, reason = c.event(t, "eth-more")
	require.Equal(t, "mismatch", outcome)
	require.Contains(t, reason, "carries 2000000000000000000 base units, the deposit says 5000000000000000000")
	c.waitStatus(t, "eth-other-user", "failed")
	_, outcome, reason = c.event(t, "eth-other-user")
	require.Equal(t, "mismatch", outcome)
	require.Contains(t, reason, "the transaction pays "+strings.ToLower(addrUser1))
	c.waitStatus(t, "eth-ok", "confirmed")
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "0", c.balance(t, 2, "ETH"))
	require.Equal(t, "5", c.balance(t, 2, "TUSD"))
	requireInvariants(t, c.Stack)
}

// TestReorgBeforeCredit: the deposit's transaction leaves the chain while
// the deposit waits for finality; it ends failed/reorged, never credited,
// as soon as the chain shows it (the block it was in replaced without it),
// not once FINALITY_TIMEOUT (its default hour, here) has passed.
func TestReorgBeforeCredit(t *testing.T) {
	c := newChainStack(t, "finalized", nil)
	ctx := context.Background()
	tx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(1))
	require.NoError(t, err)
	c.deposit(t, "reorg-wait", 1, "ETH", "1", tx.Hash)
	c.WaitFor("receipt seen", 30*time.Second, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id='reorg-wait' AND receipt_seen_at IS NOT NULL`) == 1
	})
	_, err = c.chain.Reorg(ctx, tx.Hash)
	require.NoError(t, err)
	c.waitStatus(t, "reorg-wait", "failed")
	_, outcome, _ := c.event(t, "reorg-wait")
	require.Equal(t, "reorged", outcome)
	require.Equal(t, "0", c.balance(t, 1, "ETH"))
	requireInvariants(t, c.Stack)
}

// TestReorgAfterCreditCompensatesOnce: under confirmations:1 a deposit is
// credited before finality and watched; a real reorg drops it, reported by
// the watcher and again by the provider's removed: true, and it is
// compensated exactly once.
func TestReorgAfterCreditCompensatesOnce(t *testing.T) {
	c := newChainStack(t, "confirmations:1", nil)
	ctx := context.Background()
	tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	payload := alchemyTokenPayload(c.token, addrUser1, tx, "0x6acfc0", false)
	status, body := c.alchemy(t, payload)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["accepted"])
	eventID := "chain:ETH_MAINNET:" + tx.Hash + ":0"
	c.waitStatus(t, eventID, "confirmed")
	require.Equal(t, "7", c.balance(t, 1, "TUSD"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_id=$1 AND chain_state='watching'`, eventID))

	_, err = c.chain.Reorg(ctx, tx.Hash)
	require.NoError(t, err)
	// The provider reports it too, twice; with an RPC that only makes the
	// chain decide, so the watcher writes the compensation.
	for range 2 {
		status, body = c.alchemy(t, alchemyTokenPayload(c.token, addrUser1, tx, "0x6acfc0", true))
		require.Equal(t, http.StatusOK, status, body)
		require.EqualValues(t, 0, body["reversed"], body)
	}
	c.WaitFor("compensation", time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1`, "reorg:"+eventID) == 1
	})
	c.waitStatus(t, "reorg:"+eventID, "confirmed")
	c.WaitFor("quiet", 30*time.Second, c.AllTerminal)
	time.Sleep(time.Second) // a few more watcher passes: nothing more may happen
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_type='reorg_compensation'`))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE event_type='reorg_compensation' AND amount = -7`))
	require.Equal(t, "0", c.balance(t, 1, "TUSD"))
	status2, _, _ := c.event(t, eventID)
	require.Equal(t, "confirmed", status2, "the original stays confirmed; the compensation reverses it")
	requireInvariants(t, c.Stack)
}

// TestRPCOutageDelaysNeverDrops: the RPC endpoint goes away (and then
// hangs); the breaker opens, deposits wait and nothing is credited; when
// the node is back everything completes, once.
func TestRPCOutageDelaysNeverDrops(t *testing.T) {
	c := newChainStack(t, "confirmations:1", map[string]string{"ETH_RPC_TIMEOUT": "1s", "ETH_RPC_BREAKER_OPEN_FOR": "5s"})
	// The target is set before the proxy accepts anything: serve reads it.
	proxy := newSwitchProxy(t, strings.TrimPrefix(c.chain.URL(), "http://"))
	// Restart the workers through the proxy (two of them: the breaker is
	// shared through Redis).
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "worker") {
			p.Stop(10 * time.Second)
		}
	}
	worker1 := c.StartWorker(map[string]string{"ETH_RPC_URL": "http://" + proxy.addr})
	c.StartWorker(map[string]string{"ETH_RPC_URL": "http://" + proxy.addr})

	ctx := context.Background()
	var txs []devchain.Tx
	for range 8 {
		tx, err := c.chain.SendETH(ctx, 0, addrUser2, wei(1))
		require.NoError(t, err)
		txs = append(txs, tx)
	}
	proxy.set(proxyRefuse)
	for i, tx := range txs {
		c.deposit(t, fmt.Sprintf("out-%d", i), 2, "ETH", "1", tx.Hash)
	}
	c.WaitFor("breaker open", time.Minute, func() bool {
		return metricValue(worker1.URL(), `settle_chain_breaker_state{network="ETH_MAINNET"}`) == 2
	})
	proxy.set(proxyHang)
	time.Sleep(2 * time.Second)
	require.Equal(t, "0", c.balance(t, 2, "ETH"), "nothing is credited while the chain cannot be asked")
	require.Zero(t, c.Count(`SELECT count(*) FROM payment_events WHERE status='failed'`), "nothing is dropped")

	proxy.mode.Store(proxyPass)
	c.WaitFor("everything settled", 3*time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE status='confirmed'`) == len(txs)
	})
	require.Equal(t, "8", c.balance(t, 2, "ETH"))
	requireInvariants(t, c.Stack)
}

// alchemy posts a signed Address Activity payload.
func (c *chainStack) alchemy(t *testing.T, payload []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.api.URL()+"/webhook/alchemy", strings.NewReader(string(payload)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Alchemy-Signature", harness.Sign(payload, alchemyKey))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out
}

func alchemyTokenPayload(token, to string, tx devchain.Tx, rawValue string, removed bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_test", "id": "whevt_" + tx.Hash[2:14], "createdAt": time.Now().UTC().Format(time.RFC3339),
		"type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{map[string]any{
			"fromAddress": "0x9999999999999999999999999999999999999999", "toAddress": to,
			"blockNum": fmt.Sprintf("0x%x", tx.BlockNumber), "hash": tx.Hash, "value": 7, "asset": "TUSD", "category": "token",
			"rawContract": map[string]any{"rawValue": rawValue, "address": token, "decimals": 6},
			"log":         map[string]any{"address": token, "transactionHash": tx.Hash, "logIndex": "0x0", "blockHash": tx.BlockHash, "removed": removed},
		}}},
	})
	return b
}

// metricValue reads one unlabelled metric from a /metrics page (-1 if absent).
func metricValue(base, name string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, name+" ") {
			var v float64
			if _, err := fmt.Sscan(strings.TrimPrefix(line, name+" "), &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// Proxy modes.
const (
	proxyPass int32 = iota
	proxyRefuse
	proxyHang
)

// switchProxy is a TCP proxy in front of the chain that can pass, refuse
// (close at once) or hang (accept and never answer).
type switchProxy struct {
	addr   string
	target string
	mode   atomic.Int32
	mu     sync.Mutex
	conns  []net.Conn
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &switchProxy{addr: l.Addr().String(), target: target}
	t.Cleanup(func() {
		_ = l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, conn)
			p.mu.Unlock()
			go p.serve(conn)
		}
	}()
	return p
}

// set switches the mode and cuts the connections open so far, as a node
// going away does: a client's kept-alive connection (the worker asks for
// the chain id at start) must not outlive the outage.
func (p *switchProxy) set(mode int32) {
	p.mode.Store(mode)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *switchProxy) serve(conn net.Conn) {
	switch p.mode.Load() {
	case proxyRefuse:
		_ = conn.Close()
		return
	case proxyHang:
		return // held open until the test ends: the caller's deadline fires
	}
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = conn.Close()
		return
	}
	go func() { _, _ = io.Copy(upstream, conn); _ = upstream.Close() }()
	_, _ = io.Copy(conn, upstream)
	_ = conn.Close()
}
