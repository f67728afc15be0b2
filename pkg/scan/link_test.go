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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// branchProxy is a balancer over two backends on two branches of a fork:
// the block reads inside batches (the scanner's) are answered by a
// backend still on the old branch, for the blocks recorded from it before
// the fork; everything else, header reads among it, by the node, on the
// new branch.
type branchProxy struct {
	target string
	server *httptest.Server
	mu     sync.Mutex
	old    map[string]json.RawMessage // eth_getBlockByNumber(n, true) by hex n
}

func newBranchProxy(t *testing.T, target string) *branchProxy {
	t.Helper()
	p := &branchProxy{target: target, old: map[string]json.RawMessage{}}
	p.server = httptest.NewServer(p)
	t.Cleanup(p.server.Close)
	return p
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
		out, err = p.forward(r.Context(), body)
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
	if req.Method == "eth_getBlockByNumber" && len(req.Params) > 0 && json.Unmarshal(req.Params[0], &number) == nil {
		p.mu.Lock()
		old, ok := p.old[strings.ToLower(number)]
		p.mu.Unlock()
		if ok {
			return json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": old})
		}
	}
	return p.forward(ctx, elem)
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
