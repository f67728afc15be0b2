package scan

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// branchProxy is a balancer over two backends on two branches of a fork:
// the block reads inside batches (the scanner's) are answered by a
// backend still on the old branch, for the blocks recorded from it before
// the fork; so are the range log reads once its logs are recorded
// (recordLogs), and the traces by number of the blocks whose traces are
// (recordTraces); everything else, header reads and reads by hash among
// it, by the node, on the new branch.
type branchProxy struct {
	target string
	server *httptest.Server
	mu     sync.Mutex
	old    map[string]json.RawMessage // eth_getBlockByNumber(n, true) by hex n
	logs   []json.RawMessage          // the old branch's logs; nil: none recorded
	traces map[string]json.RawMessage // debug_traceBlockByNumber(n) by hex n
	// receipts: eth_getTransactionReceipt(h) by h, of the transactions
	// mined on both branches whose receipts are recorded (recordReceipts).
	receipts map[string]json.RawMessage
}

func newBranchProxy(t *testing.T, target string) *branchProxy {
	t.Helper()
	p := &branchProxy{target: target, old: map[string]json.RawMessage{}, traces: map[string]json.RawMessage{}, receipts: map[string]json.RawMessage{}}
	p.server = httptest.NewServer(p)
	t.Cleanup(p.server.Close)
	return p
}

// call asks the node one method and answers its result.
func (p *branchProxy) call(t *testing.T, method string, params ...any) json.RawMessage {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	require.NoError(t, err)
	answer, err := p.forward(context.Background(), body)
	require.NoError(t, err)
	var r struct {
		Result json.RawMessage
		Error  json.RawMessage
	}
	require.NoError(t, json.Unmarshal(answer, &r))
	require.Empty(t, r.Error, "%s", answer)
	return r.Result
}

// recordLogs keeps the node's logs of blocks from through to as the old
// branch's: range log reads are answered from them from now on.
func (p *branchProxy) recordLogs(t *testing.T, from, to uint64) {
	t.Helper()
	var logs []json.RawMessage
	require.NoError(t, json.Unmarshal(p.call(t, "eth_getLogs", map[string]any{"fromBlock": fmt.Sprintf("0x%x", from), "toBlock": fmt.Sprintf("0x%x", to)}), &logs))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logs = append([]json.RawMessage{}, logs...)
}

// recordTraces keeps the node's traces of blocks from through to as the
// old branch's.
func (p *branchProxy) recordTraces(t *testing.T, from, to uint64) {
	t.Helper()
	for n := from; n <= to; n++ {
		raw := p.call(t, "debug_traceBlockByNumber", fmt.Sprintf("0x%x", n), map[string]any{"tracer": "callTracer"})
		p.mu.Lock()
		p.traces[fmt.Sprintf("0x%x", n)] = raw
		p.mu.Unlock()
	}
}

// recordReceipts keeps the node's receipts of transactions as the old
// branch's (for one mined on both branches, the node answers the new
// branch's block).
func (p *branchProxy) recordReceipts(t *testing.T, hashes ...string) {
	t.Helper()
	for _, h := range hashes {
		raw := p.call(t, "eth_getTransactionReceipt", h)
		p.mu.Lock()
		p.receipts[strings.ToLower(h)] = raw
		p.mu.Unlock()
	}
}

type branchRequest struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

// record keeps the node's answers for blocks from through to as the old
// branch's.
func (p *branchProxy) record(t *testing.T, from, to uint64) {
	t.Helper()
	for n := from; n <= to; n++ {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x%x",true]}`, n)
		answer, err := p.forward(context.Background(), []byte(body))
		require.NoError(t, err)
		var r struct{ Result json.RawMessage }
		require.NoError(t, json.Unmarshal(answer, &r))
		require.NotEqual(t, "null", string(r.Result))
		p.mu.Lock()
		p.old[fmt.Sprintf("0x%x", n)] = r.Result
		p.mu.Unlock()
	}
}

// catchUp: the lagging backend reaches the new branch.
func (p *branchProxy) catchUp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.old = map[string]json.RawMessage{}
	p.logs = nil
	p.traces = map[string]json.RawMessage{}
	p.receipts = map[string]json.RawMessage{}
}

func (p *branchProxy) forward(ctx context.Context, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return io.ReadAll(resp.Body)
}

func (p *branchProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var out []byte
	var elems []json.RawMessage
	if strings.HasPrefix(strings.TrimSpace(string(body)), "[") && json.Unmarshal(body, &elems) == nil {
		answers := make([]json.RawMessage, len(elems))
		for i, e := range elems {
			if answers[i], err = p.answer(r.Context(), e); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
		}
		out, err = json.Marshal(answers)
	} else {
		out, err = p.answerSingle(r.Context(), body)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// answer answers one call of a batch: from the old branch if recorded.
func (p *branchProxy) answer(ctx context.Context, elem json.RawMessage) (json.RawMessage, error) {
	var req branchRequest
	if err := json.Unmarshal(elem, &req); err != nil {
		return nil, err
	}
	var number string
	if len(req.Params) > 0 && json.Unmarshal(req.Params[0], &number) == nil {
		p.mu.Lock()
		var old json.RawMessage
		var ok bool
		switch req.Method {
		case "eth_getBlockByNumber":
			old, ok = p.old[strings.ToLower(number)]
		case "debug_traceBlockByNumber":
			old, ok = p.traces[strings.ToLower(number)]
		case "eth_getTransactionReceipt":
			old, ok = p.receipts[strings.ToLower(number)]
		}
		p.mu.Unlock()
		if ok {
			return json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": old})
		}
	}
	return p.forward(ctx, elem)
}

// answerSingle answers a call alone: a range log read from the old
// branch's logs if recorded, anything else by the node.
func (p *branchProxy) answerSingle(ctx context.Context, body []byte) ([]byte, error) {
	var req branchRequest
	var filter struct {
		FromBlock, ToBlock string
		BlockHash          string
		Address            json.RawMessage
		Topics             []json.RawMessage
	}
	if json.Unmarshal(body, &req) == nil && req.Method == "eth_getTransactionReceipt" {
		return p.answer(ctx, body)
	}
	if json.Unmarshal(body, &req) != nil || req.Method != "eth_getLogs" || len(req.Params) != 1 ||
		json.Unmarshal(req.Params[0], &filter) != nil || filter.BlockHash != "" {
		return p.forward(ctx, body)
	}
	p.mu.Lock()
	logs := p.logs
	p.mu.Unlock()
	if logs == nil {
		return p.forward(ctx, body)
	}
	from, err1 := hexutil.DecodeUint64(filter.FromBlock)
	to, err2 := hexutil.DecodeUint64(filter.ToBlock)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("branch proxy: range %q..%q", filter.FromBlock, filter.ToBlock)
	}
	out := []json.RawMessage{}
	for _, raw := range logs {
		var l struct {
			Address     string
			BlockNumber string
			Topics      []string
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, err
		}
		n, err := hexutil.DecodeUint64(l.BlockNumber)
		if err != nil {
			return nil, err
		}
		if n >= from && n <= to && matchesAny(filter.Address, l.Address) && matchesTopics(filter.Topics, l.Topics) {
			out = append(out, raw)
		}
	}
	return json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": out})
}

// matchesAny: a filter's position (null, one value, or a list) admits v.
func matchesAny(position json.RawMessage, v string) bool {
	if len(position) == 0 || string(position) == "null" {
		return true
	}
	var values []string
	if json.Unmarshal(position, &values) != nil {
		var one string
		if json.Unmarshal(position, &one) != nil {
			return false
		}
		values = []string{one}
	}
	for _, w := range values {
		if strings.EqualFold(w, v) {
			return true
		}
	}
	return false
}

func matchesTopics(filter []json.RawMessage, topics []string) bool {
	for i, position := range filter {
		if len(position) == 0 || string(position) == "null" {
			continue
		}
		if i >= len(topics) || !matchesAny(position, topics[i]) {
			return false
		}
	}
	return true
}

// TestCursorPassReadsOneBranch: under confirmations:2, a fork deeper than
// the policy mines a deposit inside the range of the next cursor pass.
// Behind a balancer, that pass's block reads are answered (all, or the
// lower half) by a backend still on the old branch, while the node
// answering everything else is on the new one. Reading all its blocks
// from the old branch, the pass records its last block's hash as it read
// it, so the next pass, reading the new branch, finds the block below it
// replaced and rescans; reading the range split between the branches, its
// blocks do not link and the pass fails, to run again. Either way the
// deposit is stored. (With the hash recorded from a header read of its
// own, answered by the new branch, the next pass found nothing replaced,
// and the deposit was never read.)
func TestCursorPassReadsOneBranch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name  string
		stale uint64 // the range's blocks, from its first, the old backend answers
	}{
		{"every block from the old branch", 6},
		{"the range split between the branches", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			const network = "ETH_MAINNET"
			const to = "0x00000000000000000000000000000000000a0d1a"
			const pass = 6
			f := newDevScanFixture(t, ctx, network, []string{to})
			proxy := newBranchProxy(t, f.ch.URL())
			client, err := chain.Dial(ctx, proxy.server.URL, chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
			require.NoError(t, err)
			t.Cleanup(client.Close)
			policy, err := chain.ConfirmationsPolicy(2)
			require.NoError(t, err)
			n := Network{Name: network, RPC: client, Policy: policy}
			reg := prometheus.NewRegistry()
			scanner := New(Options{Store: f.db, Owner: "dev-scan", Registerer: reg, Networks: []Network{n}, Log: zerolog.Nop(),
				BlocksMax: pass, ReorgRescan: 16})
			drain := func() {
				for more, passes := true, 0; more; passes++ {
					require.Less(t, passes, 100)
					more, err = scanner.CursorPass(ctx, n)
					require.NoError(t, err)
				}
			}

			require.NoError(t, f.ch.CommitBlocks(ctx, 3))
			start, err := f.ch.Head(ctx)
			require.NoError(t, err)
			require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
			require.NoError(t, f.ch.CommitBlocks(ctx, 4))
			drain() // the cursor knows the hash of the block below the next range
			first, _, _, err := f.db.ScanCursor(ctx, network)
			require.NoError(t, err)
			last := first + pass - 1

			// The old branch reaches past the next range; the lagging
			// backend keeps its blocks. Then the fork, from the block below
			// the range, mines the deposit in the range's first block.
			require.NoError(t, f.ch.CommitBlocks(ctx, pass+2))
			proxy.record(t, first, first+c.stale-1)
			oldHead, err := f.ch.ForkAt(ctx, first-1)
			require.NoError(t, err)
			deposit, err := f.ch.QueueETH(ctx, 1, to, big.NewInt(1e15))
			require.NoError(t, err)
			require.NoError(t, f.ch.CommitBlocks(ctx, int(oldHead-(first-1))+1))
			receipt, err := f.client.Receipt(ctx, deposit)
			require.NoError(t, err)
			require.Equal(t, first, receipt.BlockNumber)
			id := payment.Transfer{Network: network, TxHash: deposit, Index: payment.TransferNative}.EventID()
			stored := func() int {
				var k int
				require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&k))
				return k
			}

			_, err = scanner.CursorPass(ctx, n)
			next, _, _, cursorErr := f.db.ScanCursor(ctx, network)
			require.NoError(t, cursorErr)
			if c.stale < pass {
				require.ErrorIs(t, err, payment.ErrUnavailable)
				require.ErrorContains(t, err, "backends on different branches")
				require.Equal(t, first, next, "the cursor stays")
			} else {
				require.NoError(t, err)
				require.Equal(t, last+1, next)
				require.Zero(t, stored(), "the old branch has no deposit")
			}

			proxy.catchUp()
			require.NoError(t, f.ch.CommitBlocks(ctx, 2))
			drain()
			for did := true; did; {
				did, err = scanner.RescanPass(ctx, n)
				require.NoError(t, err)
			}
			require.Equal(t, 1, stored(), "the deposit the fork mined in block %d, inside the pass's range, is stored", first)
			if c.stale == pass {
				require.InDelta(t, 1, counterValue(t, reg, "settle_scan_reorgs_below_cursor_total", ""), 0, "the next pass found its block below replaced")
			}
		})
	}
}

// TestCursorPassLinksWithoutNativeReads: a network whose cursor passes
// read no blocks for deposits (no address registered, or no native coin
// listed) still reads its range's blocks under confirmations:N, records
// its last block's hash as read, and finds a fork below the cursor.
func TestCursorPassLinksWithoutNativeReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name       string
		registered []string
		noNative   bool
	}{
		{"no address registered", nil, false},
		{"no native coin listed", []string{"0x00000000000000000000000000000000000a0d1b"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			const network = "ETH_MAINNET"
			f := newDevScanFixture(t, ctx, network, c.registered)
			if c.noNative {
				_, err := f.conn.Exec(ctx, `DELETE FROM network_assets WHERE network = $1 AND contract_address IS NULL`, network)
				require.NoError(t, err)
				registry, err := f.db.Assets(ctx)
				require.NoError(t, err)
				_, native := registry.Native(network)
				require.False(t, native)
			}
			policy, err := chain.ConfirmationsPolicy(2)
			require.NoError(t, err)
			f.n.Policy = policy
			f.scanner.networks[network] = f.n
			f.scanner.opts.ReorgRescan = 16
			require.NoError(t, f.ch.CommitBlocks(ctx, 3))
			start, err := f.ch.Head(ctx)
			require.NoError(t, err)
			require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
			require.NoError(t, f.ch.CommitBlocks(ctx, 8))
			f.drain(t, ctx)
			next, _, _, err := f.db.ScanCursor(ctx, network)
			require.NoError(t, err)
			below, err := f.client.HeaderByNumber(ctx, next-1)
			require.NoError(t, err)
			var recorded string
			require.NoError(t, f.conn.QueryRow(ctx, `SELECT last_hash FROM chain_cursors WHERE network = $1`, network).Scan(&recorded))
			require.Equal(t, below.Hash, recorded)

			oldHead, err := f.ch.ForkAt(ctx, next-4)
			require.NoError(t, err)
			require.NoError(t, f.ch.CommitBlocks(ctx, int(oldHead-(next-4))+1))
			f.drain(t, ctx)
			require.InDelta(t, 1, counterValue(t, f.reg, "settle_scan_reorgs_below_cursor_total", ""), 0)
		})
	}
}

// TestLinkNeedsEveryParent: a block read without its parentHash cannot be
// linked; the pass says so rather than blame the backends' branches.
func TestLinkNeedsEveryParent(t *testing.T) {
	s := New(Options{})
	h := func(b byte) string { return "0x" + strings.Repeat(string(rune('a'+b)), 64) }
	claim := postgres.ScanClaim{From: 10, To: 11, LastHash: h(0)}
	blocks := []chain.Block{{Number: 10, Hash: h(1), ParentHash: h(0)}, {Number: 11, Hash: h(2)}}
	err := s.link(context.Background(), Network{Name: "ETH_MAINNET"}, &claim, blocks)
	require.ErrorContains(t, err, "block 11 read without its parentHash")
	require.Empty(t, claim.ToHash, "nothing recorded")
	blocks[1].ParentHash = h(1)
	require.NoError(t, s.link(context.Background(), Network{Name: "ETH_MAINNET"}, &claim, blocks))
	require.Equal(t, h(2), claim.ToHash)
}

// branchFixture is a dev scan fixture whose scanner, under
// confirmations:2, reads through a branchProxy.
type branchFixture struct {
	*devScanFixture
	proxy   *branchProxy
	n       Network
	scanner *Scanner
	reg     *prometheus.Registry
}

func newBranchFixture(t *testing.T, ctx context.Context, network string, registered []string, opts Options) *branchFixture {
	t.Helper()
	f := newDevScanFixture(t, ctx, network, registered)
	proxy := newBranchProxy(t, f.ch.URL())
	client, err := chain.Dial(ctx, proxy.server.URL, chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	policy, err := chain.ConfirmationsPolicy(2)
	require.NoError(t, err)
	n := Network{Name: network, RPC: client, Policy: policy}
	reg := prometheus.NewRegistry()
	opts.Store, opts.Owner, opts.Registerer, opts.Networks, opts.Log = f.db, "dev-scan", reg, []Network{n}, zerolog.Nop()
	return &branchFixture{devScanFixture: f, proxy: proxy, n: n, scanner: New(opts), reg: reg}
}

func (b *branchFixture) drain(t *testing.T, ctx context.Context) {
	t.Helper()
	for more, passes := true, 0; more; passes++ {
		require.Less(t, passes, 100)
		var err error
		more, err = b.scanner.CursorPass(ctx, b.n)
		require.NoError(t, err)
	}
}

func (b *branchFixture) stored(t *testing.T, ctx context.Context, id string) int {
	t.Helper()
	var k int
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&k))
	return k
}

// branches starts the cursor, then mines the old branch (old, from the
// block the next pass starts at, then pass+2 blocks) and returns that
// block; record keeps what the lagging backend answers from it; then the
// fork, from the block below, mines the new branch (fresh, from that
// block, then past the old head).
func (b *branchFixture) branches(t *testing.T, ctx context.Context, pass int, old, record, fresh func(first uint64)) uint64 {
	t.Helper()
	require.NoError(t, b.ch.CommitBlocks(ctx, 3))
	start, err := b.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, b.db.InitScanCursor(ctx, b.n.Name, start+1))
	require.NoError(t, b.ch.CommitBlocks(ctx, 4))
	b.drain(t, ctx)
	first, _, _, err := b.db.ScanCursor(ctx, b.n.Name)
	require.NoError(t, err)
	_, err = b.ch.ForkAt(ctx, first-1) // the block the next pass starts at is mined again
	require.NoError(t, err)
	old(first)
	require.NoError(t, b.ch.CommitBlocks(ctx, pass+2))
	record(first)
	oldHead, err := b.ch.ForkAt(ctx, first-1)
	require.NoError(t, err)
	fresh(first)
	head, err := b.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, int(oldHead-head)+1))
	return first
}

// TestCursorPassLogsFromTheBlocksBranch: under confirmations:2 a fork
// deeper than the policy mines, in the first block of the next pass's
// range, a token deposit the old branch has not; the old branch has
// another transfer of the token in that block. Behind a balancer, the
// pass's eth_getLogs is answered by a backend still on the old branch,
// its blocks by the node on the new one. The logs do not name the blocks
// read, so the pass fails and runs again, and the new branch's deposit is
// stored; the old branch's is not. (Taken as they came, the old branch's
// transfer stood for the block's, its bloom was not asked about, and the
// cursor passed the new branch's deposit for good.)
func TestCursorPassLogsFromTheBlocksBranch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d1c"
	const pass = 6
	b := newBranchFixture(t, ctx, network, []string{to}, Options{BlocksMax: pass, ReorgRescan: 16})
	token, _, err := b.ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	_, err = b.conn.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('TOK', $1, $2, 6)`, network, token)
	require.NoError(t, err)
	second := b.ch.Accounts()[1].Address
	_, err = b.ch.TransferToken(ctx, 0, token, second, big.NewInt(1_000_000_000))
	require.NoError(t, err)

	var oldTx, newTx string
	first := b.branches(t, ctx, pass,
		func(first uint64) {
			tx, err := b.ch.TransferToken(ctx, 1, token, to, big.NewInt(3_000_000))
			require.NoError(t, err)
			require.Equal(t, first, tx.BlockNumber)
			oldTx = tx.Hash
		},
		func(first uint64) { b.proxy.recordLogs(t, first, first+pass+1) },
		func(first uint64) {
			tx, err := b.ch.TransferToken(ctx, 0, token, to, big.NewInt(5_000_000))
			require.NoError(t, err)
			require.Equal(t, first, tx.BlockNumber)
			newTx = tx.Hash
		})
	idOf := func(tx string) string {
		return payment.Transfer{Network: network, TxHash: tx, Index: payment.LogIndexTransfer(0)}.EventID()
	}

	_, passErr := b.scanner.CursorPass(ctx, b.n)
	next, _, _, err := b.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	b.proxy.catchUp()
	b.drain(t, ctx)
	require.Equal(t, 1, b.stored(t, ctx, idOf(newTx)), "the new branch's deposit in block %d is stored", first)
	require.Zero(t, b.stored(t, ctx, idOf(oldTx)), "the old branch's is not")
	require.ErrorIs(t, passErr, payment.ErrUnavailable)
	require.ErrorContains(t, passErr, "eth_getLogs answered logs of block")
	require.ErrorContains(t, passErr, "backends on different branches")
	require.Equal(t, first, next, "the cursor stayed")
}

// TestCursorPassTracesTheBlocksRead: under SCAN_TRACES=on and
// confirmations:2 a fork deeper than the policy mines an internal
// transfer to a registered address in the first block of the next pass's
// range. The backend answering traces by number is still on the old
// branch; the blocks come from the new one. The pass traces the blocks it
// read by their hashes, so the transfer is found. (Traced by number, the
// old branch's block answered, with nothing in it, and the cursor passed
// the transfer for good.)
func TestCursorPassTracesTheBlocksRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d1d"
	const pass = 6
	b := newBranchFixture(t, ctx, network, []string{to}, Options{BlocksMax: pass, ReorgRescan: 16, Traces: true})
	forwarder, _, err := b.ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)

	var forward string
	first := b.branches(t, ctx, pass,
		func(uint64) {
			_, err := b.ch.SendETH(ctx, 1, "0x00000000000000000000000000000000000f0d1d", big.NewInt(1e15))
			require.NoError(t, err)
		},
		func(first uint64) { b.proxy.recordTraces(t, first, first+pass+1) },
		func(first uint64) {
			tx, err := b.ch.SendForward(ctx, 0, forwarder, to, big.NewInt(1e15), devchain.ForwardDirect)
			require.NoError(t, err)
			require.Equal(t, first, tx.BlockNumber)
			forward = tx.Hash
		})
	id := payment.Transfer{Network: network, TxHash: forward, Index: payment.TraceTransfer("CALL_0")}.EventID()

	b.drain(t, ctx)
	next, _, _, err := b.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.Greater(t, next, first, "the cursor passed the block")
	require.Equal(t, 1, b.stored(t, ctx, id), "the internal transfer the fork mined in block %d is stored", first)
	require.Positive(t, counterValue(t, b.reg, "settle_scan_rpc_calls_total", chain.MethodTraceBlockByHash))
	require.Zero(t, counterValue(t, b.reg, "settle_scan_rpc_calls_total", chain.MethodTraceBlock))
}

// TestRescanPassLinksItsBlocks: under confirmations:2 a rescan's range is
// split by a fork deeper than the policy: its lower blocks are answered
// by a backend still on the old branch, the rest by the node on the new
// one, which holds a deposit in the range's first block. The blocks do
// not link: the pass fails and runs again, and the deposit is stored.
// (Unlinked, the job read the old branch's first block, found nothing,
// and ended done.)
func TestRescanPassLinksItsBlocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d1e"
	const pass = 6
	b := newBranchFixture(t, ctx, network, []string{to}, Options{BlocksMax: pass, ReorgRescan: 16})
	require.NoError(t, b.ch.CommitBlocks(ctx, 3))
	base, err := b.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, pass+2))
	b.proxy.record(t, base+1, base+3)
	oldHead, err := b.ch.ForkAt(ctx, base)
	require.NoError(t, err)
	deposit, err := b.ch.QueueETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, int(oldHead-base)+1))
	receipt, err := b.client.Receipt(ctx, deposit)
	require.NoError(t, err)
	require.Equal(t, base+1, receipt.BlockNumber)
	id := payment.Transfer{Network: network, TxHash: deposit, Index: payment.TransferNative}.EventID()
	job, err := b.db.CreateRescan(ctx, "rescan_branches", network, base+1, base+pass, "test")
	require.NoError(t, err)

	_, passErr := b.scanner.RescanPass(ctx, b.n)
	storedFirst := b.stored(t, ctx, id)
	b.proxy.catchUp()
	for did := true; did; {
		did, err = b.scanner.RescanPass(ctx, b.n)
		require.NoError(t, err)
	}
	require.Equal(t, 1, b.stored(t, ctx, id), "the deposit the fork mined in block %d is stored", base+1)
	require.ErrorIs(t, passErr, payment.ErrUnavailable)
	require.ErrorContains(t, passErr, "backends on different branches")
	require.Zero(t, storedFirst)
	var state string
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT status FROM rescan_jobs WHERE id = $1`, job.ID).Scan(&state))
	require.Equal(t, "done", state)
}

// TestRescanPassLinksToItsPassBefore: under confirmations:2 a fork deeper
// than the policy mines a deposit in the first block of a rescan's range.
// The job's first pass is answered by a backend still on the old branch
// (its blocks link, and hold no deposit); its second, after that backend
// caught up, by the new branch. The second pass's first block does not
// name the last block the first pass read as its parent: the branch
// changed under the job, which reads its range again, and the deposit is
// stored. (Each pass linked only its own blocks, so the job ended done
// with the first blocks read from the old branch and the deposit passed
// for good.)
func TestRescanPassLinksToItsPassBefore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d1f"
	const pass = 3
	b := newBranchFixture(t, ctx, network, []string{to}, Options{BlocksMax: pass, ReorgRescan: 16})
	require.NoError(t, b.ch.CommitBlocks(ctx, 3))
	base, err := b.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, 2*pass+2))
	b.proxy.record(t, base+1, base+pass)
	oldHead, err := b.ch.ForkAt(ctx, base)
	require.NoError(t, err)
	deposit, err := b.ch.QueueETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, int(oldHead-base)+1))
	receipt, err := b.client.Receipt(ctx, deposit)
	require.NoError(t, err)
	require.Equal(t, base+1, receipt.BlockNumber)
	id := payment.Transfer{Network: network, TxHash: deposit, Index: payment.TransferNative}.EventID()
	job, err := b.db.CreateRescan(ctx, "rescan_passes", network, base+1, base+2*pass, "test")
	require.NoError(t, err)
	jobState := func() (next uint64, hash, status string) {
		require.NoError(t, b.conn.QueryRow(ctx, `SELECT next_block, COALESCE(last_hash, ''), status FROM rescan_jobs WHERE id = $1`, job.ID).
			Scan(&next, &hash, &status))
		return next, hash, status
	}

	did, err := b.scanner.RescanPass(ctx, b.n)
	require.NoError(t, err)
	require.True(t, did)
	next, hash, _ := jobState()
	require.Equal(t, base+pass+1, next, "the first pass read the old branch's blocks")
	require.Zero(t, b.stored(t, ctx, id), "the old branch has no deposit")
	var oldLast struct{ Hash string }
	b.proxy.mu.Lock()
	raw := b.proxy.old[fmt.Sprintf("0x%x", base+pass)]
	b.proxy.mu.Unlock()
	require.NoError(t, json.Unmarshal(raw, &oldLast))
	require.Equal(t, oldLast.Hash, hash, "the job records the last block its pass read")

	b.proxy.catchUp()
	did, err = b.scanner.RescanPass(ctx, b.n)
	require.NoError(t, err)
	require.True(t, did)
	restart, restartHash, restartStatus := jobState()
	for did := true; did; {
		did, err = b.scanner.RescanPass(ctx, b.n)
		require.NoError(t, err)
	}
	require.Equal(t, 1, b.stored(t, ctx, id), "the deposit the fork mined in block %d is stored", base+1)
	require.Equal(t, "running", restartStatus)
	require.Equal(t, base+1, restart, "the job reads its range again from its start")
	require.Empty(t, restartHash)
	require.InDelta(t, 1, counterValue(t, b.reg, "settle_scan_passes_total", "restarted"), 0)
	_, _, status := jobState()
	require.Equal(t, "done", status)
}

// TestRescanRestartCountsEachTransferOnce: as above, but one deposit is
// mined in the first block of the range on both branches (the same
// transaction) and the fork mines another there. The first pass finds
// the first; the restart reads the block again and finds both. The job
// counts two, not three (a restart added what it read again to found),
// and shows its restart: counted, when and why.
func TestRescanRestartCountsEachTransferOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d2f"
	const pass = 3
	b := newBranchFixture(t, ctx, network, []string{to}, Options{BlocksMax: pass, ReorgRescan: 16})
	require.NoError(t, b.ch.CommitBlocks(ctx, 3))
	base, err := b.ch.Head(ctx)
	require.NoError(t, err)
	both, err := b.ch.QueueETH(ctx, 2, to, big.NewInt(2e15))
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, 2*pass+2))
	b.proxy.record(t, base+1, base+pass)
	b.proxy.recordReceipts(t, both)
	oldHead, err := b.ch.ForkAt(ctx, base)
	require.NoError(t, err)
	again, err := b.ch.QueueETH(ctx, 2, to, big.NewInt(2e15))
	require.NoError(t, err)
	require.Equal(t, both, again, "the same transaction, mined on both branches")
	fresh, err := b.ch.QueueETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.NoError(t, b.ch.CommitBlocks(ctx, int(oldHead-base)+1))
	for _, tx := range []string{both, fresh} {
		receipt, err := b.client.Receipt(ctx, tx)
		require.NoError(t, err)
		require.Equal(t, base+1, receipt.BlockNumber)
	}
	job, err := b.db.CreateRescan(ctx, "rescan_counts", network, base+1, base+2*pass, "test")
	require.NoError(t, err)

	did, err := b.scanner.RescanPass(ctx, b.n)
	require.NoError(t, err)
	require.True(t, did)
	got, err := b.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Found, "the old branch's deposit")
	require.Zero(t, got.Restarts)
	require.Nil(t, got.LastRestartAt)
	var foundIn uint64
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT block_number FROM rescan_found WHERE job_id = $1`, job.ID).Scan(&foundIn))
	require.Equal(t, base+1, foundIn, "the job keeps the block it found the deposit in")

	b.proxy.catchUp()
	for did := true; did; {
		did, err = b.scanner.RescanPass(ctx, b.n)
		require.NoError(t, err)
	}
	got, err = b.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "done", got.Status)
	require.InDelta(t, 1, counterValue(t, b.reg, "settle_scan_passes_total", "restarted"), 0)
	require.Equal(t, 2, got.Found, "each transfer counted once, however often the job read its block")
	require.Equal(t, 1, got.Restarts)
	require.NotNil(t, got.LastRestartAt)
	require.Contains(t, got.LastRestartReason, fmt.Sprintf("the branch changed under the job between its passes: block %d is 0x", base+pass))
	require.True(t, strings.HasSuffix(got.LastRestartReason, fmt.Sprintf("; reading again from block %d", base+1)), got.LastRestartReason)
	var kept int
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT count(*) FROM rescan_found WHERE job_id = $1`, job.ID).Scan(&kept))
	require.Zero(t, kept, "a job that ended keeps no ids")
}
