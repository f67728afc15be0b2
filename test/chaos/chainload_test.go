package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

var (
	flagChain     = flag.Bool("chaos.chain", true, "chain mode: real transactions on a simulated node behind a JSON-RPC fault proxy, reported by both webhooks")
	flagChainRate = flag.Float64("chaos.chainrate", 2, "on-chain transfers per second (chain mode)")
)

// Chain mode bounds.
const (
	chainNetwork       = "ETH_MAINNET"
	chainToken         = "CHAOS"
	chainTokenDecimals = 6
	ethDecimals        = 18
	// chainUserBase: the chain's users are apart from the webhook load's,
	// so each side's expected balances are its own.
	chainUserBase    = 100
	chainUserCount   = 8
	addressesPerUser = 2
	// chainSenders dev accounts send transfers, one transaction at a time
	// each; account 0 deploys the token, the last one sends the doubler's
	// transactions.
	chainSenders       = 3
	chainBlockInterval = 500 * time.Millisecond
	// The soak's finality: a few confirmations, so deposits are credited
	// before finality and watched; a short recheck delay, so the watch's
	// evidence rule is exercised within the run.
	chainConfirmations = 3
	reorgRecheckDelay  = 5 * time.Second
	// chainFinalityTimeout is far beyond what a canonical transfer needs
	// (confirmations take seconds; an RPC outage does not count), and is
	// how long a report of a transfer a fork dropped before its credit
	// waits before it ends reorged or not_found.
	chainFinalityTimeout = 45 * time.Second
	// remineAfter is how long a fork that mines a transaction again keeps
	// it off the chain: a few reorg-watch passes (REORG_WATCH_INTERVAL 1s),
	// so a credited deposit is compensated first and then given back.
	remineAfter = 5 * time.Second
	// remineDepth is the depth of the forks that mine their transaction
	// again: past chainConfirmations, still far from finality.
	remineDepth = 8
	// rpcNullBurst bounds every lie about one transaction well inside
	// reorgRecheckDelay: no two invented nulls are the delay apart.
	rpcNullBurst = reorgRecheckDelay / 2
	// Baseline lies of the RPC proxy, always on.
	rpcNullShare  = 0.15
	rpcErrorShare = 0.002
	// A transfer is reported by 1..reportsMax deliveries, each after up to
	// reportDelayMax, each redelivered up to redeliveriesMax times.
	reportsMax      = 3
	reportDelayMax  = 3 * time.Second
	redeliveriesMax = 2
	redeliveryGap   = 2 * time.Second
	// conflictPct of the later deliveries race a conflicting version
	// (same id, one base unit more); transferIndexPct of the payments
	// deliveries name their transfer.
	conflictPct       = 20
	transferIndexPct  = 50
	alchemyPct        = 50
	ethWeiMax         = 3_000_000_000_000_000_000
	tokenUnitsMax     = 5_000_000_000
	chainSendRetries  = 3
	alchemySigningKey = "whsec_chaos-alchemy-signing-key-0123456789"
)

// chainRig is the chain of chain mode: the node, a direct client for
// the soak's own questions, the fault proxy settle talks through, and
// the token and addresses the deposits use.
type chainRig struct {
	chain *devchain.Chain
	eth   *ethclient.Client // straight to the node: the verifier's truth
	rpc   *rpcProxy
	token string
	// raw sends the doubler's transactions (two identical Transfer logs).
	raw     *rawSender
	doubler common.Address
	users   []int64
	addrs   map[int64][]string
	owner   map[string]int64
}

func startChain(t *testing.T, seed uint64) *chainRig {
	t.Helper()
	ctx := context.Background()
	ch, err := devchain.Serve(ctx, devchain.Options{BlockInterval: chainBlockInterval, Accounts: chainSenders + 2})
	if err != nil {
		t.Fatalf("dev chain: %v", err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	token, _, err := ch.DeployToken(ctx, 0)
	if err != nil {
		t.Fatalf("deploy token: %v", err)
	}
	eth, err := ethclient.DialContext(ctx, ch.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eth.Close)
	r := &chainRig{chain: ch, eth: eth, token: strings.ToLower(token), addrs: map[int64][]string{}, owner: map[string]int64{}}
	if r.raw, err = newRawSender(eth, ch.Accounts()[chainSenders+1]); err != nil {
		t.Fatal(err)
	}
	if err := r.deployDoubler(ctx); err != nil {
		t.Fatalf("deploy the doubler: %v", err)
	}
	r.rpc = newRPCProxy(t, ch.URL(), seed, rpcNullBurst)
	r.rpc.SetBaseline(rpcNullShare, rpcErrorShare)
	rng := rand.New(rand.NewPCG(seed, 0xadd7))
	for i := range chainUserCount {
		user := int64(chainUserBase + 1 + i)
		r.users = append(r.users, user)
		for range addressesPerUser {
			var a common.Address
			for j := range a {
				a[j] = byte(rng.IntN(256))
			}
			addr := strings.ToLower(a.Hex())
			r.addrs[user] = append(r.addrs[user], addr)
			r.owner[addr] = user
		}
	}
	return r
}

// settings point settle at the proxy with a finality that credits early
// and watches.
func (r *chainRig) settings(m map[string]string) {
	m["ETH_RPC_URL"] = r.rpc.URL()
	m["DEPOSIT_FINALITY"] = fmt.Sprintf("confirmations:%d", chainConfirmations)
	m["REORG_RECHECK_DELAY"] = reorgRecheckDelay.String()
	m["FINALITY_TIMEOUT"] = chainFinalityTimeout.String()
	m["FINALITY_RECHECK_MIN"] = "200ms"
	m["FINALITY_RECHECK_MAX"] = "2s"
	m["FINALITY_HINT_TTL"] = "200ms"
	m["REORG_WATCH_INTERVAL"] = "1s"
	m["ETH_RPC_TIMEOUT"] = "2s"
	m["ETH_RPC_BREAKER_OPEN_FOR"] = "3s"
	m["ALCHEMY_SIGNING_KEY"] = alchemySigningKey
}

// prepare registers the token before any process reads the registry.
func (r *chainRig) prepare(s *harness.Stack) {
	_, err := s.DB.Exec(context.Background(), `INSERT INTO assets (code, network, contract_address, decimals) VALUES ($1, $2, $3, $4)`,
		chainToken, chainNetwork, r.token, chainTokenDecimals)
	if err != nil {
		s.T.Fatalf("register token: %v", err)
	}
}

// register creates the chain's users and their deposit addresses
// through the admin API.
func (r *chainRig) register(t *testing.T, apiURL string) {
	t.Helper()
	client := harness.NewClient(apiURL)
	for _, user := range r.users {
		status, body, err := client.Admin(http.MethodPut, fmt.Sprintf("/admin/users/%d", user), nil)
		if err != nil || (status != http.StatusCreated && status != http.StatusOK) {
			t.Fatalf("create user %d: %d %v %v", user, status, body, err)
		}
		for _, addr := range r.addrs[user] {
			status, body, err := client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addr, "network": chainNetwork, "user_id": user})
			if err != nil || status != http.StatusCreated {
				t.Fatalf("register %s for user %d: %d %v %v", addr, user, status, body, err)
			}
		}
	}
}

// transfer is one on-chain transfer the soak made: the model's truth.
type transfer struct {
	n      int
	user   int64
	to     string
	from   string
	token  string // the token's contract, for its payloads
	asset  string
	base   *big.Int
	amount decimal.Decimal
	hash   string
	block  uint64
	// index is the contract's transfer index: "native" or the Transfer
	// log's decimal logIndex.
	index string
	// minedIndex is the index the transfer was first mined at (a fork
	// may re-mine it elsewhere; the verifier sets index to where it is).
	minedIndex string
	reports    []*report
	reorged    bool // under chainLoad.mu: a fork the soak made dropped it
	// sender is the index of the load's sender account that sent it; -1
	// for the doubler's.
	sender int
}

// report is one provider delivery of a transfer, with the answers it got.
type report struct {
	source       string // "payments" or "alchemy"
	id           string // payments only: the provider's id
	withIndex    bool
	body         []byte
	conflictBody []byte // non-nil: a conflicting version races the original
	redeliveries int
	removed      bool // Alchemy reports the log removed by a reorg

	// Under chainLoad.mu: which version the api said it holds.
	originalHeld bool
	conflictHeld bool
	answered     bool
}

// chainLoad makes transfers on the chain and reports each one through
// the providers, as they would: late, more than once, under other ids,
// out of order, sometimes contradicting themselves.
type chainLoad struct {
	rig    *chainRig
	apiURL string
	runID  string
	seed   uint64
	rate   float64
	client *http.Client

	// reports tracks every delivery under way, the reorgs' too.
	reports sync.WaitGroup

	mu         sync.Mutex
	reorgs     []string
	transfers  []*transfer
	sendErrors map[string]int
	answers    map[string]int
	retried    map[string]int
	anomalies  []string
	anomalous  int
	undeliv    []string
	deliveries int
	forks      []devchain.Reorg

	// faults, if set, is the provider-fault mode (providers_test.go).
	faults *providerFaults

	// senders[s] is held while sender s sends, and while a fork keeps one
	// of its transactions off the chain to mine it again: no new
	// transaction may take its nonce meanwhile.
	senders [chainSenders]sync.Mutex
}

func newChainLoad(rig *chainRig, apiURL, runID string, seed uint64, rate float64) *chainLoad {
	return &chainLoad{
		rig: rig, apiURL: apiURL, runID: runID, seed: seed, rate: rate,
		client: &http.Client{Timeout: attemptTimeout, Transport: &http.Transport{
			MaxIdleConns: groupsInFlightMax, MaxIdleConnsPerHost: groupsInFlightMax, IdleConnTimeout: time.Minute,
		}},
		sendErrors: map[string]int{}, answers: map[string]int{}, retried: map[string]int{},
	}
}

// run makes transfers until stop, then waits for every report to get
// its answer.
func (l *chainLoad) run(ctx context.Context, stop <-chan struct{}) {
	if l.faults != nil {
		l.faults.begin()
	}
	var senders sync.WaitGroup
	interval := time.Duration(float64(time.Second) * chainSenders / l.rate)
	for s := range chainSenders {
		senders.Go(func() {
			rng := rand.New(rand.NewPCG(l.seed, uint64(0xc4a1+s)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(interval/2 + rand.N(interval)):
				}
				l.senders[s].Lock()
				sent := l.transfer(ctx, rng, s, i)
				l.senders[s].Unlock()
				for _, tr := range sent {
					for _, rep := range tr.reports {
						seed := rng.Uint64() // rng belongs to this goroutine
						if l.faults != nil {
							l.faults.shape(rep)
							l.reports.Go(func() { l.faults.deliver(ctx, l, seed, rep) })
							continue
						}
						l.reports.Go(func() { l.deliverReport(ctx, seed, rep) })
					}
				}
			}
		})
	}
	senders.Wait()
	l.reports.Wait()
}

// reorg forks the chain to drop one recent, not yet final transfer (the
// deepest whose block is at most depth blocks below the head), and has
// Alchemy report its log removed if Alchemy reported it. Transactions of the dropped blocks other than
// it are mined again in other blocks.
func (l *chainLoad) reorg(ctx context.Context, depth uint64) string {
	head, err := l.rig.chain.Head(ctx)
	if err != nil {
		return "head: " + err.Error()
	}
	finalized, err := l.rig.chain.Finalized(ctx)
	if err != nil {
		return "finalized: " + err.Error()
	}
	remine := l.faults != nil && *flagScanInterval != "off" && rand.N(2) == 0
	if remine {
		// Deep enough that its deposit is likely credited (and watched)
		// already, so the fork takes money back and the transfer's return
		// gives it back.
		depth = max(depth, remineDepth)
	}
	l.mu.Lock()
	var candidates []*transfer
	for _, tr := range l.transfers {
		if !tr.reorged && tr.block > finalized && head-tr.block+1 <= depth && (!remine || l.remines(tr)) {
			candidates = append(candidates, tr)
		}
	}
	l.mu.Unlock()
	if len(candidates) == 0 {
		return fmt.Sprintf("no transfer within %d blocks of head %d (finalized %d): nothing reorged", depth, head, finalized)
	}
	// The deepest candidate is the likeliest to be credited already, so
	// that the fork takes money back rather than only a pending deposit.
	tr := candidates[rand.N(len(candidates))]
	for _, c := range candidates {
		if c.block < tr.block {
			tr = c
		}
	}
	if remine {
		return l.dropAndRemine(ctx, tr)
	}
	r, err := l.rig.chain.Reorg(ctx, tr.hash)
	if err != nil {
		return fmt.Sprintf("reorg of %s failed: %v", tr.hash, err)
	}
	l.mu.Lock()
	for _, t := range l.transfers {
		t.reorged = t.reorged || t.hash == tr.hash
	}
	what := fmt.Sprintf("dropped %s (%s %s to user %d, block %d): forked at %d, head %d → %d", tr.hash, tr.amount, tr.asset, tr.user, tr.block, r.ForkedAt, r.OldHead, r.NewHead)
	l.reorgs = append(l.reorgs, what)
	l.mu.Unlock()
	l.forked(ctx, tr, r)
	return what
}

// forked records a fork the soak made, and what follows from it: a
// rescan of the blocks it rewrote (provider-fault mode), and Alchemy's
// report of tr's log removed if Alchemy reported tr.
func (l *chainLoad) forked(ctx context.Context, tr *transfer, r devchain.Reorg) {
	l.mu.Lock()
	l.forks = append(l.forks, r)
	alchemyReported := false
	for _, rep := range tr.reports {
		alchemyReported = alchemyReported || rep.source == "alchemy"
	}
	l.mu.Unlock()
	if l.faults != nil {
		l.reports.Go(func() { l.faults.rescanFork(ctx, l.apiURL, r) })
	}
	if alchemyReported {
		removed := &report{source: "alchemy", removed: true, body: alchemyBody(tr, tr.base, rand.New(rand.NewPCG(rand.Uint64(), 1)), true)}
		l.reports.Go(func() { l.deliver(ctx, removed, false) })
	}
}

// remines tells whether a fork may drop tr and mine it again later: a
// native transfer of a sender account. Only while the scanner runs (it
// finds the transfer again; a deposit compensated meanwhile is then
// watched again and given back once final, which the verifier expects).
func (l *chainLoad) remines(tr *transfer) bool {
	return tr.asset == "ETH" && tr.sender >= 0
}

// dropAndRemine forks tr's transaction off the chain, as reorg does but
// with no replacement: Alchemy reports its log removed, and after
// remineAfter (long enough for the reorg watch to compensate a credited
// deposit) the very same transaction is mined again in a later block. Its
// sender sends nothing meanwhile.
func (l *chainLoad) dropAndRemine(ctx context.Context, tr *transfer) string {
	l.senders[tr.sender].Lock()
	defer l.senders[tr.sender].Unlock()
	r, raw, err := l.rig.chain.Drop(ctx, tr.hash)
	if err != nil {
		return fmt.Sprintf("drop of %s failed: %v", tr.hash, err)
	}
	l.forked(ctx, tr, r)
	select {
	case <-ctx.Done():
	case <-time.After(remineAfter):
	}
	mined, err := l.rig.chain.Resend(ctx, raw)
	what := fmt.Sprintf("dropped %s (%s %s to user %d, block %d): forked at %d, head %d → %d; mined again",
		tr.hash, tr.amount, tr.asset, tr.user, tr.block, r.ForkedAt, r.OldHead, r.NewHead)
	if err != nil {
		// Still off the chain: the verifier reads the node, and a
		// transfer it cannot find is one a fork dropped.
		what += fmt.Sprintf(" failed: %v", err)
	} else {
		what += fmt.Sprintf(" in block %d", mined.BlockNumber)
	}
	l.mu.Lock()
	if err == nil {
		tr.block = mined.BlockNumber
	}
	l.reorgs = append(l.reorgs, what)
	l.mu.Unlock()
	return what
}

// transfer sends one real transaction and plans its reports.
func (l *chainLoad) transfer(ctx context.Context, rng *rand.Rand, sender, i int) []*transfer {
	user := l.rig.users[rng.IntN(len(l.rig.users))]
	to := l.rig.addrs[user][rng.IntN(addressesPerUser)]
	tr := &transfer{user: user, to: to, from: l.rig.chain.Accounts()[1+sender].Address, token: l.rig.token, sender: sender}
	var tx devchain.Tx
	var err error
	var twinLogs [2]uint
	twin := false
	for attempt := range chainSendRetries {
		tr.asset, twin = chainToken, false
		tr.base = big.NewInt(1 + rng.Int64N(tokenUnitsMax))
		tr.amount = decimal.NewFromBigInt(tr.base, -chainTokenDecimals)
		switch pick := rng.IntN(100); {
		case pick < 50:
			tr.asset, tr.index = "ETH", "native"
			tr.base = big.NewInt(1 + rng.Int64N(ethWeiMax))
			tr.amount = decimal.NewFromBigInt(tr.base, -ethDecimals)
			tx, err = l.rig.chain.SendETH(ctx, 1+sender, to, tr.base)
		case pick < 50+50*twinPct/100:
			twin = true
			tr.from, tr.sender = strings.ToLower(l.rig.doubler.Hex()), -1
			tx, twinLogs, err = l.rig.sendTwin(ctx, to, tr.base)
		default:
			tx, err = l.rig.chain.TransferToken(ctx, 1+sender, l.rig.token, to, tr.base)
		}
		if err == nil && tx.Status == 1 {
			break
		}
		l.mu.Lock()
		l.sendErrors[fmt.Sprintf("attempt %d: %v", attempt, err)]++
		l.mu.Unlock()
	}
	if err != nil || tx.Status != 1 {
		return nil
	}
	tr.hash, tr.block = tx.Hash, tx.BlockNumber
	out := []*transfer{tr}
	switch {
	case twin:
		other := *tr
		tr.index = strconv.FormatUint(uint64(twinLogs[0]), 10)
		other.index = strconv.FormatUint(uint64(twinLogs[1]), 10)
		out = append(out, &other)
	case tr.asset == chainToken:
		receipt, err := l.rig.receipt(ctx, tx.Hash)
		if err != nil || len(receipt.Logs) != 1 {
			l.mu.Lock()
			l.sendErrors[fmt.Sprintf("token receipt: %v", err)]++
			l.mu.Unlock()
			return nil
		}
		tr.index = strconv.FormatUint(uint64(receipt.Logs[0].Index), 10)
	}
	for j, t := range out {
		l.plan(rng, t, fmt.Sprintf("%d-%d.%d", sender, i, j))
	}
	l.mu.Lock()
	for _, t := range out {
		t.n = len(l.transfers)
		l.transfers = append(l.transfers, t)
	}
	l.mu.Unlock()
	return out
}

// plan draws the transfer's reports. The first report is never
// contradicted, so each transfer has at least one truthful report; a
// conflict races a payments report under its own id, or the transfer's
// only Alchemy report (all Alchemy reports of a transfer share one id).
func (l *chainLoad) plan(rng *rand.Rand, tr *transfer, tag string) {
	n := 1 + rng.IntN(reportsMax)
	alchemyReports := 0
	for k := range n {
		rep := &report{source: "payments", redeliveries: rng.IntN(redeliveriesMax + 1)}
		if rng.IntN(100) < alchemyPct {
			rep.source = "alchemy"
			alchemyReports++
		}
		switch rep.source {
		case "payments":
			rep.id = fmt.Sprintf("%s-tx%s-%d-%d", l.runID, tag, k, rng.IntN(1_000_000))
			rep.withIndex = rng.IntN(100) < transferIndexPct
			rep.body = paymentsBody(rep.id, tr, tr.amount, rep.withIndex)
		case "alchemy":
			rep.body = alchemyBody(tr, tr.base, rng, false)
		}
		tr.reports = append(tr.reports, rep)
	}
	more := new(big.Int).Add(tr.base, big.NewInt(1))
	decimals := int32(ethDecimals)
	if tr.asset == chainToken {
		decimals = chainTokenDecimals
	}
	for _, rep := range tr.reports[1:] {
		if rng.IntN(100) >= conflictPct {
			continue
		}
		switch {
		case rep.source == "payments":
			rep.conflictBody = paymentsBody(rep.id, tr, decimal.NewFromBigInt(more, -decimals), rep.withIndex)
		case alchemyReports == 1:
			rep.conflictBody = alchemyBody(tr, more, rng, false)
		}
	}
}

// receipt reads a mined transaction's receipt from the node, waiting
// (bounded) while a fork that re-mines it has it in the pool: a transfer
// the load forgot would still be on the chain, and the scanner credits it.
func (r *chainRig) receipt(ctx context.Context, hash string) (*types.Receipt, error) {
	deadline := time.Now().Add(rawMinedWaitMax)
	for {
		receipt, err := r.eth.TransactionReceipt(ctx, common.HexToHash(hash))
		if !errors.Is(err, ethereum.NotFound) || time.Now().After(deadline) {
			return receipt, err
		}
		select {
		case <-time.After(rawMinedPoll):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func paymentsBody(id string, tr *transfer, amount decimal.Decimal, withIndex bool) []byte {
	m := map[string]any{"event_id": id, "event_type": "deposit", "user_id": tr.user, "asset": tr.asset, "amount": amount.String(), "tx_hash": tr.hash}
	if withIndex {
		m["transfer_index"] = tr.index
	}
	b, _ := json.Marshal(m)
	return b
}

// alchemyBody is an Address Activity payload with the one activity of
// the transfer; its amount is rawValue, the float value is decoration.
func alchemyBody(tr *transfer, raw *big.Int, rng *rand.Rand, removed bool) []byte {
	act := map[string]any{
		"fromAddress": tr.from, "toAddress": tr.to, "blockNum": fmt.Sprintf("0x%x", tr.block), "hash": tr.hash,
		"value": 0.1, "asset": tr.asset,
	}
	if tr.asset == "ETH" {
		act["category"] = "external"
		act["rawContract"] = map[string]any{"rawValue": "0x" + raw.Text(16), "address": nil, "decimals": ethDecimals}
		if removed {
			act["log"] = map[string]any{"transactionHash": tr.hash, "removed": true}
		}
	} else {
		logIndex, _ := strconv.ParseUint(tr.index, 10, 64)
		act["category"] = "token"
		act["rawContract"] = map[string]any{"rawValue": "0x" + raw.Text(16), "address": tr.token, "decimals": chainTokenDecimals}
		act["log"] = map[string]any{"address": tr.token, "transactionHash": tr.hash, "logIndex": fmt.Sprintf("0x%x", logIndex), "removed": removed}
	}
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_chaos", "id": fmt.Sprintf("whevt_%d", rng.Uint64()), "createdAt": time.Now().UTC().Format(time.RFC3339Nano),
		"type": "ADDRESS_ACTIVITY", "event": map[string]any{"network": chainNetwork, "activity": []any{act}},
	})
	return b
}

// deliverReport sends one report late, with its conflicting twin at the
// same instant if it has one, then redelivers it.
func (l *chainLoad) deliverReport(ctx context.Context, seed uint64, rep *report) {
	rng := rand.New(rand.NewPCG(seed, 0xde11))
	select {
	case <-time.After(time.Duration(rng.Int64N(int64(reportDelayMax)))):
	case <-ctx.Done():
		return
	}
	var race sync.WaitGroup
	if rep.conflictBody != nil {
		race.Go(func() { l.deliver(ctx, rep, true) })
	}
	l.deliver(ctx, rep, false)
	race.Wait()
	for range rep.redeliveries {
		select {
		case <-time.After(time.Duration(rng.Int64N(int64(redeliveryGap)))):
		case <-ctx.Done():
			return
		}
		l.deliver(ctx, rep, false)
	}
}

// deliver repeats one version of a report until a definitive answer.
func (l *chainLoad) deliver(ctx context.Context, rep *report, conflicting bool) {
	l.mu.Lock()
	l.deliveries++
	l.mu.Unlock()
	body, label := rep.body, rep.source
	if conflicting {
		body, label = rep.conflictBody, rep.source+"-conflict"
	}
	deadline := time.Now().Add(deliveryMax)
	backoff := backoffMin
	for {
		if l.faults.silenced(rep) {
			return // the provider is paused: it sends nothing
		}
		status, answer, err := l.post(ctx, rep.source, body)
		if err == nil && definitive(status) {
			l.record(rep, conflicting, label, status, answer)
			return
		}
		why := fmt.Sprintf("status %d", status)
		if err != nil {
			why = errorClass(err)
		}
		l.mu.Lock()
		l.retried[why]++
		l.mu.Unlock()
		if time.Now().After(deadline) || ctx.Err() != nil {
			l.mu.Lock()
			l.undeliv = append(l.undeliv, fmt.Sprintf("%s %s (last: %s)", label, rep.id, why))
			l.mu.Unlock()
			return
		}
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2)):
		case <-ctx.Done():
		}
		backoff = min(backoff*2, backoffMax)
	}
}

type providerAnswer struct {
	Status     string `json:"status"`
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	Reversed   int    `json:"reversed"`
	Ignored    int    `json:"ignored"`
}

// record reads what the answer says the api now holds under the
// report's id: this version, the other one, or (Alchemy only) nothing.
func (l *chainLoad) record(rep *report, conflicting bool, label string, status int, a providerAnswer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rep.removed {
		label = "alchemy-removed"
	}
	key := fmt.Sprintf("%s %d %s", label, status, a.Status)
	if rep.source == "alchemy" {
		key = fmt.Sprintf("%s %d accepted=%d duplicates=%d reversed=%d ignored=%d", label, status, a.Accepted, a.Duplicates, a.Reversed, a.Ignored)
	}
	l.answers[key]++
	if rep.removed {
		// What a removal does is the chain's to decide; any 200 will do.
		if status != http.StatusOK {
			l.anomalyLocked("alchemy removal: got %d %+v", status, a)
		}
		return
	}
	held, other := &rep.originalHeld, &rep.conflictHeld
	if conflicting {
		held, other = other, held
	}
	switch {
	case rep.source == "payments" && status == http.StatusOK && (a.Status == "accepted" || a.Status == "duplicate"):
		*held = true
	case rep.source == "payments" && status == http.StatusConflict:
		*other = true
	case rep.source == "alchemy" && status == http.StatusOK && a.Accepted+a.Duplicates == 1 && a.Ignored == 0:
		*held = true
	case rep.source == "alchemy" && status == http.StatusOK && a.Ignored == 1 && conflicting:
		// The transfer's event holds other content (or the activity was
		// refused): the conflict is not stored.
	case rep.source == "alchemy" && status == http.StatusOK && a.Ignored == 1 && rep.conflictBody != nil:
		*other = true
	default:
		l.anomalyLocked("%s %s: got %d %+v", label, rep.id, status, a)
		return
	}
	if !conflicting {
		rep.answered = true
	}
	if rep.originalHeld && rep.conflictHeld {
		l.anomalyLocked("%s %s: both versions answered as stored", label, rep.id)
	}
}

func (l *chainLoad) anomalyLocked(format string, args ...any) {
	l.anomalous++
	if len(l.anomalies) < anomalySamples {
		l.anomalies = append(l.anomalies, fmt.Sprintf(format, args...))
	}
}

func (l *chainLoad) post(ctx context.Context, source string, b []byte) (int, providerAnswer, error) {
	path, header, secret := "/webhook/payments", "X-Signature", harness.WebhookSecret
	if source == "alchemy" {
		path, header, secret = "/webhook/alchemy", "X-Alchemy-Signature", alchemySigningKey
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.apiURL+path, bytes.NewReader(b))
	if err != nil {
		return 0, providerAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(header, harness.Sign(b, secret))
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, providerAnswer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, responseBytesMax))
	if err != nil {
		return 0, providerAnswer{}, err
	}
	var a providerAnswer
	_ = json.Unmarshal(data, &a)
	return resp.StatusCode, a, nil
}

// summary is the chain load's account of the run.
func (l *chainLoad) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	reports := 0
	for _, tr := range l.transfers {
		reports += len(tr.reports)
	}
	fmt.Fprintf(&b, "chain: %d transfers, %d reports, %d deliveries\n", len(l.transfers), reports, l.deliveries)
	b.WriteString("chain answers:")
	for _, k := range sortedKeys(l.answers) {
		fmt.Fprintf(&b, " [%s]=%d", k, l.answers[k])
	}
	b.WriteString("\nchain redelivered because:")
	for _, k := range sortedKeys(l.retried) {
		fmt.Fprintf(&b, " [%s]=%d", k, l.retried[k])
	}
	for _, r := range l.reorgs {
		fmt.Fprintf(&b, "\nchain reorg: %s", r)
	}
	if len(l.sendErrors) > 0 {
		b.WriteString("\nchain send errors:")
		for _, k := range sortedKeys(l.sendErrors) {
			fmt.Fprintf(&b, " [%s]=%d", k, l.sendErrors[k])
		}
	}
	if l.faults != nil {
		b.WriteString("\n" + l.faults.summary())
	}
	b.WriteString("\n")
	return b.String()
}
