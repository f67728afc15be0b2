package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// baseChainID is BASE_MAINNET's chain id (migration 0012).
const baseChainID = 8453

// twoNetworks is a settle installation on two dev chains: ETH_MAINNET
// (chain id 1) and BASE_MAINNET (8453), each with the same test token
// contract at the same address (both deployed by account 0 at nonce 0),
// listed as DUSD with 6 decimals on ETH_MAINNET and 18 on BASE_MAINNET.
type twoNetworks struct {
	*harness.Stack
	eth, base *devchain.Chain
	token     string
	client    *harness.Client
	api       *harness.Proc
	// baseDown cuts BASE_MAINNET's RPC (the worker's view of it).
	baseDown atomic.Bool
	baseURL  string
}

func newTwoNetworks(t *testing.T, chainOpts devchain.Options, extra map[string]string) *twoNetworks {
	t.Helper()
	ctx := context.Background()
	n := &twoNetworks{}
	var err error
	n.eth, err = devchain.Serve(ctx, chainOpts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.eth.Close() })
	baseOpts := chainOpts
	baseOpts.ChainID = baseChainID
	n.base, err = devchain.Serve(ctx, baseOpts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.base.Close() })
	tokenETH, _, err := n.eth.DeployToken(ctx, 0)
	require.NoError(t, err)
	tokenBase, _, err := n.base.DeployToken(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, strings.ToLower(tokenETH), strings.ToLower(tokenBase), "one contract address on both chains")
	n.token = strings.ToLower(tokenETH)

	// A switchable proxy in front of BASE_MAINNET's node: down, every
	// call fails as a dead endpoint would.
	target, err := url.Parse(n.base.URL())
	require.NoError(t, err)
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.baseDown.Load() {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	n.baseURL = proxy.URL

	s := harness.NewStack(t)
	n.Stack = s
	_, err = s.DB.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('DUSD', 'ETH_MAINNET', $1, 6)`, n.token)
	require.NoError(t, err)
	_, err = s.DB.Exec(ctx, `INSERT INTO network_assets (network, asset, contract_address, decimals) VALUES ('BASE_MAINNET', 'DUSD', $1, 18)`, n.token)
	require.NoError(t, err)
	s.Env["NETWORKS"] = "ETH_MAINNET,BASE_MAINNET"
	s.Env["ETH_RPC_URL"] = n.eth.URL()
	s.Env["RPC_URL_BASE_MAINNET"] = n.baseURL
	s.Env["DEPOSIT_FINALITY"] = "confirmations:1"
	s.Env["ALCHEMY_SIGNING_KEY"] = alchemyKey
	s.Env["POLL_INTERVAL"] = "200ms"
	s.Env["FINALITY_RECHECK_MIN"] = "100ms"
	s.Env["FINALITY_RECHECK_MAX"] = "500ms"
	s.Env["FINALITY_HINT_TTL"] = "50ms"
	s.Env["REORG_WATCH_INTERVAL"] = "300ms"
	s.Env["SCAN_INTERVAL"] = "off"
	for k, v := range extra {
		s.Env[k] = v
	}
	n.api = s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	n.client = harness.NewClient(n.api.URL())
	createUsers(t, n.client, 1, 2)
	for _, network := range []string{"ETH_MAINNET", "BASE_MAINNET"} {
		for user, addr := range map[int64]string{1: addrUser1, 2: addrUser2} {
			status, body, err := n.client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addr, "network": network, "user_id": user})
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, status, body)
		}
	}
	return n
}

func (n *twoNetworks) pay(t *testing.T, fields map[string]any) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(fields)
	status, answer, err := n.client.Webhook(body)
	require.NoError(t, err)
	return status, answer
}

func (n *twoNetworks) alchemy(t *testing.T, payload []byte) (int, map[string]any) {
	t.Helper()
	c := &chainStack{Stack: n.Stack, api: n.api}
	return c.alchemy(t, payload)
}

func (n *twoNetworks) state(t *testing.T, id string) (status, outcome string) {
	t.Helper()
	c := &chainStack{Stack: n.Stack}
	status, outcome, _ = c.event(t, id)
	return status, outcome
}

func (n *twoNetworks) waitStatus(t *testing.T, id, want string) {
	t.Helper()
	(&chainStack{Stack: n.Stack}).waitStatus(t, id, want)
}

func (n *twoNetworks) balance(t *testing.T, user int64, asset string) string {
	t.Helper()
	return (&chainStack{Stack: n.Stack}).balance(t, user, asset)
}

// alchemyTokenOn is an Alchemy token activity on network.
func alchemyTokenOn(network, token, to string, tx devchain.Tx, rawValue string) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_test", "id": "whevt_" + network + tx.Hash[2:14], "createdAt": time.Now().UTC().Format(time.RFC3339),
		"type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": network, "activity": []any{map[string]any{
			"fromAddress": "0x9999999999999999999999999999999999999999", "toAddress": to,
			"blockNum": fmt.Sprintf("0x%x", tx.BlockNumber), "hash": tx.Hash, "value": 1, "asset": "DUSD", "category": "token",
			"rawContract": map[string]any{"rawValue": rawValue, "address": token, "decimals": 6},
			"log":         map[string]any{"address": token, "transactionHash": tx.Hash, "logIndex": "0x0", "blockHash": tx.BlockHash, "removed": false},
		}}},
	})
	return b
}

func tokens(units int64, decimals int) *big.Int {
	return new(big.Int).Mul(big.NewInt(units), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(decimals)), nil))
}

// TestDepositsOnTwoNetworksCreditOneBalance: the native coin and a token
// on two networks credit one balance per asset code; each event and each
// journal row names its network; the token, at one contract address on
// both chains, has its own decimals on each (amounts from Alchemy's
// rawValue and from /webhook/payments exact on both); a transfer reported
// on the network it was not sent on is not credited; precision is the
// network's; a network not enabled is a 400.
func TestDepositsOnTwoNetworksCreditOneBalance(t *testing.T) {
	n := newTwoNetworks(t, devchain.Options{Manual: true}, map[string]string{"FINALITY_TIMEOUT": "6s", "REORG_RECHECK_DELAY": "1s"})
	ctx := context.Background()
	// The worker reports the networks it has an RPC on, for the api.
	require.Eventually(t, func() bool {
		return n.Count(`SELECT count(*) FROM network_rpc_reports WHERE network IN ('ETH_MAINNET', 'BASE_MAINNET') AND reported_at > now() - interval '1 minute'`) == 2
	}, 10*time.Second, 50*time.Millisecond)

	ethOnETH, err := n.eth.SendETH(ctx, 0, addrUser1, wei(1))
	require.NoError(t, err)
	ethOnBase, err := n.base.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	// 2.5 DUSD on each: 2_500_000 base units at 6 decimals, 2.5e18 at 18.
	tokenOnETH, err := n.eth.TransferToken(ctx, 0, n.token, addrUser1, big.NewInt(2_500_000))
	require.NoError(t, err)
	tokenOnBase, err := n.base.TransferToken(ctx, 0, n.token, addrUser1, new(big.Int).Div(tokens(5, 18), big.NewInt(2)))
	require.NoError(t, err)
	// A second token transfer on BASE, reported through /webhook/payments
	// with an amount finer than 6 decimals: exact at BASE's 18.
	fineOnBase, err := n.base.TransferToken(ctx, 0, n.token, addrUser1, big.NewInt(1_000_000_000_001))
	require.NoError(t, err)
	require.NoError(t, n.eth.CommitBlocks(ctx, 2))
	require.NoError(t, n.base.CommitBlocks(ctx, 2))

	status, answer := n.pay(t, map[string]any{"event_id": "eth-on-eth", "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "1", "tx_hash": ethOnETH.Hash})
	require.Equal(t, http.StatusOK, status, answer)
	status, answer = n.pay(t, map[string]any{"event_id": "eth-on-base", "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "2", "tx_hash": ethOnBase.Hash, "network": "BASE_MAINNET"})
	require.Equal(t, http.StatusOK, status, answer)
	status, answer = n.alchemy(t, alchemyTokenOn("ETH_MAINNET", n.token, addrUser1, tokenOnETH, "0x2625a0"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	status, answer = n.alchemy(t, alchemyTokenOn("BASE_MAINNET", n.token, addrUser1, tokenOnBase, "0x22b1c8c1227a0000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	status, answer = n.pay(t, map[string]any{"event_id": "fine-on-base", "event_type": "deposit", "user_id": 1, "asset": "DUSD", "amount": "0.000001000000000001", "tx_hash": fineOnBase.Hash, "network": "BASE_MAINNET"})
	require.Equal(t, http.StatusOK, status, answer)

	// The ETH_MAINNET transaction reported as if on BASE_MAINNET: the
	// same contract exists there, but not this transaction.
	status, answer = n.pay(t, map[string]any{"event_id": "wrong-network", "event_type": "deposit", "user_id": 2, "asset": "DUSD", "amount": "2.5", "tx_hash": tokenOnETH.Hash, "network": "BASE_MAINNET"})
	require.Equal(t, http.StatusOK, status, answer)

	tokenETHID := "chain:ETH_MAINNET:" + tokenOnETH.Hash + ":0"
	tokenBaseID := "chain:BASE_MAINNET:" + tokenOnBase.Hash + ":0"
	for _, id := range []string{"eth-on-eth", "eth-on-base", tokenETHID, tokenBaseID, "fine-on-base"} {
		n.waitStatus(t, id, "confirmed")
	}
	// not_found needs two null reads the delay and a new block apart.
	n.WaitFor("the first absence", time.Minute, func() bool {
		return n.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'wrong-network' AND absent_since IS NOT NULL`) == 1
	})
	require.NoError(t, n.base.CommitBlocks(ctx, 1))
	n.waitStatus(t, "wrong-network", "failed")
	_, outcome := n.state(t, "wrong-network")
	require.Equal(t, "not_found", outcome, "BASE_MAINNET's node has no such transaction")

	require.Equal(t, "3", n.balance(t, 1, "ETH"), "1 on ETH_MAINNET + 2 on BASE_MAINNET, one balance")
	require.Equal(t, "5.000001000000000001", n.balance(t, 1, "DUSD"), "2.5 + 2.5 + the fine amount, exact at each network's decimals")
	require.Equal(t, "0", n.balance(t, 2, "DUSD"))

	// Every event and journal row names its network.
	want := map[string]string{
		"eth-on-eth": "ETH_MAINNET", "eth-on-base": "BASE_MAINNET", tokenETHID: "ETH_MAINNET", tokenBaseID: "BASE_MAINNET", "fine-on-base": "BASE_MAINNET",
	}
	for id, network := range want {
		var onEvent, onJournal string
		require.NoError(t, n.DB.QueryRow(ctx, `SELECT COALESCE(e.network, ''), COALESCE(j.network, '') FROM payment_events e
			JOIN balance_events j ON j.source_event_id = e.event_id WHERE e.event_id = $1`, id).Scan(&onEvent, &onJournal), id)
		require.Equal(t, network, onEvent, id)
		require.Equal(t, network, onJournal, id)
	}
	require.Equal(t, 5, n.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	// The journal API says each row's network too.
	status, page, err := n.client.Admin(http.MethodGet, "/v1/users/1/journal", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, page)
	byNetwork := map[string]string{}
	for _, raw := range page["entries"].([]any) {
		entry := raw.(map[string]any)
		byNetwork[entry["source_event_id"].(string)] = fmt.Sprint(entry["network"])
	}
	require.Equal(t, want, byNetwork)

	// Precision is the network's: 7 decimals of DUSD are too fine on
	// ETH_MAINNET (6), fine on BASE_MAINNET (18).
	status, answer = n.pay(t, map[string]any{"event_id": "too-fine", "event_type": "deposit", "user_id": 1, "asset": "DUSD", "amount": "1.0000001"})
	require.Equal(t, http.StatusBadRequest, status, answer)
	require.Equal(t, "invalid_amount", answer["code"], answer)
	status, answer = n.pay(t, map[string]any{"event_id": "fine-enough", "event_type": "deposit", "user_id": 1, "asset": "DUSD", "amount": "1.0000001", "network": "BASE_MAINNET"})
	require.Equal(t, http.StatusOK, status, answer)
	n.waitStatus(t, "fine-enough", "confirmed")
	// A network settle knows but does not run here, and one it does not know.
	for _, network := range []string{"OPT_MAINNET", "NOT_A_NETWORK"} {
		status, answer = n.pay(t, map[string]any{"event_id": "elsewhere-" + network, "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "1", "network": network})
		require.Equal(t, http.StatusBadRequest, status, answer)
		require.Contains(t, answer["error"], "not enabled", answer)
	}
	// An asset not listed on the network.
	status, answer = n.pay(t, map[string]any{"event_id": "no-listing", "event_type": "deposit", "user_id": 1, "asset": "WBTC", "amount": "1", "network": "BASE_MAINNET"})
	require.Equal(t, http.StatusBadRequest, status, answer)
	require.Equal(t, "unknown_asset", answer["code"], answer)
	require.Equal(t, 0, n.Count(`SELECT count(*) FROM payment_events WHERE event_id IN ('too-fine', 'elsewhere-OPT_MAINNET', 'elsewhere-NOT_A_NETWORK', 'no-listing')`))
	requireInvariants(t, n.Stack)
}

// TestWorkerRefusesAnRPCOfAnotherChain: RPC_URL_BASE_MAINNET pointing at
// a node of chain 1 stops the worker, and the scheduler (its scanner on
// or off), at start, with one line naming the setting.
func TestWorkerRefusesAnRPCOfAnotherChain(t *testing.T) {
	ctx := context.Background()
	eth, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eth.Close() })
	s := harness.NewStack(t)
	s.Env["NETWORKS"] = "ETH_MAINNET,BASE_MAINNET"
	s.Env["ETH_RPC_URL"] = eth.URL()
	s.Env["RPC_URL_BASE_MAINNET"] = eth.URL() // chain 1, not 8453
	s.Env["METRICS_ADDR"] = "127.0.0.1:0"

	// The scheduler checks with its scanner off too.
	for bin, extra := range map[string]string{"worker": "", "scheduler": "SCAN_INTERVAL=off"} {
		t.Run(bin, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(harness.Binaries(t), bin))
			for k, v := range s.Env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			if extra != "" {
				cmd.Env = append(cmd.Env, extra)
			}
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("the %s did not stop on a wrong chain id", bin)
			}
			require.Error(t, err, "exits non-zero")
			require.NotEqual(t, 0, cmd.ProcessState.ExitCode())
			var named []string
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if strings.Contains(line, "RPC_URL_BASE_MAINNET") {
					named = append(named, line)
				}
			}
			require.Len(t, named, 1, "one line names the setting:\n%s", out)
			require.Contains(t, named[0], "answers eth_chainId 1")
			require.Contains(t, named[0], "8453")
			require.NotContains(t, string(out), "ETH_RPC_URL or RPC_URL_ETH_MAINNET answers", "ETH_MAINNET's endpoint is right")
		})
	}
}

// TestOneNetworkDownOthersSettle: under load on both networks, with
// BASE_MAINNET's RPC down for a minute or more, ETH_MAINNET's deposits are all
// confirmed while it is down (their latency is printed), and BASE's are
// all confirmed once it is back: nothing is lost.
func TestOneNetworkDownOthersSettle(t *testing.T) {
	n := newTwoNetworks(t, devchain.Options{BlockInterval: 200 * time.Millisecond}, map[string]string{
		"ETH_RPC_BREAKER_OPEN_FOR": "2s",
	})
	ctx := context.Background()
	const outage = 60 * time.Second
	const every = 250 * time.Millisecond // one deposit per network per tick

	type sent struct {
		id, network string
		at          time.Time
	}
	var mu sync.Mutex
	var all []sent
	send := func(c *devchain.Chain, network string, i int) {
		tx, err := c.SendETH(ctx, 0, addrUser1, big.NewInt(int64(1_000_000_000+i)))
		if err != nil {
			t.Errorf("send on %s: %v", network, err)
			return
		}
		id := fmt.Sprintf("%s-%d", network, i)
		fields := map[string]any{"event_id": id, "event_type": "deposit", "user_id": 1, "asset": "ETH",
			"amount": weiText(int64(1_000_000_000 + i)), "tx_hash": tx.Hash, "network": network}
		status, answer := n.pay(t, fields)
		if status != http.StatusOK {
			t.Errorf("%s: %d %v", id, status, answer)
			return
		}
		mu.Lock()
		all = append(all, sent{id: id, network: network, at: time.Now()})
		mu.Unlock()
	}

	// Warm up both networks, then cut BASE_MAINNET's RPC and keep the load
	// on both for the outage.
	for i := 0; i < 4; i++ {
		send(n.eth, "ETH_MAINNET", i)
		send(n.base, "BASE_MAINNET", i)
	}
	n.baseDown.Store(true)
	downSince := time.Now()
	i := 4
	var wg sync.WaitGroup
	for time.Since(downSince) < outage-10*time.Second {
		wg.Add(2)
		go func(i int) { defer wg.Done(); send(n.eth, "ETH_MAINNET", i) }(i)
		go func(i int) {
			defer wg.Done()
			// Mined on BASE's own node; only settle's view of it is cut.
			send(n.base, "BASE_MAINNET", i)
		}(i)
		i++
		time.Sleep(every)
	}
	wg.Wait()

	// While BASE is still down, every ETH_MAINNET deposit is confirmed.
	// BASE stays down until they are (it comes back only below), so the
	// wait is generous: a loaded machine confirms the last sends late, and
	// ETH work stuck behind BASE's stays stuck however long it is given.
	n.WaitFor("ETH_MAINNET deposits confirmed while BASE_MAINNET is down", time.Minute, func() bool {
		return n.Count(`SELECT count(*) FROM payment_events WHERE network = 'ETH_MAINNET' AND status <> 'confirmed'`) == 0
	})
	baseConfirmed := n.Count(`SELECT count(*) FROM payment_events WHERE network = 'BASE_MAINNET' AND status = 'confirmed' AND event_id NOT IN ('BASE_MAINNET-0','BASE_MAINNET-1','BASE_MAINNET-2','BASE_MAINNET-3')`)
	require.Zero(t, n.Count(`SELECT count(*) FROM payment_events WHERE network = 'BASE_MAINNET' AND status = 'failed'`), "an outage fails nothing")

	// Latency of ETH_MAINNET's deposits during the outage, from the 200 to
	// the terminal status (the database's updated_at).
	var lat []time.Duration
	rows, err := n.DB.Query(ctx, `SELECT event_id, updated_at FROM payment_events WHERE network = 'ETH_MAINNET'`)
	require.NoError(t, err)
	done := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		require.NoError(t, rows.Scan(&id, &at))
		done[id] = at
	}
	rows.Close()
	mu.Lock()
	for _, s := range all {
		if s.network == "ETH_MAINNET" && s.at.After(downSince) {
			lat = append(lat, done[s.id].Sub(s.at))
		}
	}
	total := len(all)
	mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	require.NotEmpty(t, lat)
	t.Logf("ETH_MAINNET during BASE_MAINNET's outage: %d deposits, p50 %s, p99 %s, max %s; BASE_MAINNET confirmed meanwhile: %d",
		len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], baseConfirmed)

	// BASE comes back: all its deposits are confirmed, none lost.
	time.Sleep(time.Until(downSince.Add(outage)))
	n.baseDown.Store(false)
	n.WaitFor("every deposit confirmed after the outage", 2*time.Minute, func() bool {
		return n.Count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`) == total
	})
	require.Equal(t, total, n.Count(`SELECT count(*) FROM balance_events`))
	requireInvariants(t, n.Stack)
}

// weiText writes a wei amount as ETH in exact decimal text.
func weiText(wei int64) string {
	s := fmt.Sprintf("%019d", wei)
	whole, frac := s[:len(s)-18], strings.TrimRight(s[len(s)-18:], "0")
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}

// TestUnlistedNetworkStopsEachBinary: NETWORKS naming a network the
// networks table does not list (a typo of ETH_MAINNET, say) would refuse
// every event on the network meant; api, worker and scheduler stop at
// start instead, non-zero, naming the setting and the name.
func TestUnlistedNetworkStopsEachBinary(t *testing.T) {
	s := harness.NewStack(t)
	for bin, portVar := range map[string]string{"api": "HTTP_ADDR", "worker": "METRICS_ADDR", "scheduler": "METRICS_ADDR"} {
		t.Run(bin, func(t *testing.T) {
			port, err := devenv.FreePort()
			require.NoError(t, err)
			env := map[string]string{"NETWORKS": "ETH_MAINET", "DEPOSIT_FINALITY": "none", portVar: fmt.Sprintf("127.0.0.1:%d", port)}
			for k, v := range s.Env {
				if _, set := env[k]; !set {
					env[k] = v
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(harness.Binaries(t), bin))
			cmd.Env = testenv.Env(env)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s started with NETWORKS=ETH_MAINET:\n%s", bin, out)
			require.NotZero(t, exit.ExitCode())
			require.Contains(t, string(out), "setting NETWORKS: ETH_MAINET not in the networks table")
		})
	}
}
