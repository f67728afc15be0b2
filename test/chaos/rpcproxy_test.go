package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/settle/settle/pkg/chain/devchain"
)

// RPC proxy bounds.
const (
	rpcBodyMax         = 1 << 20
	rpcUpstreamTimeout = 10 * time.Second
	rpcLatencyCap      = 5 * time.Second
	// lagShare of the calls reach the lagging node during a lag window;
	// the others reach one that keeps up, so answers flip between heads.
	lagShare = 0.5
)

// JSON-RPC methods the proxy lies about.
const (
	methodReceipt     = "eth_getTransactionReceipt"
	methodTxByHash    = "eth_getTransactionByHash"
	methodBlockNumber = "eth_blockNumber"
	methodBlockByNum  = "eth_getBlockByNumber"
)

// rpcProxy is an HTTP reverse proxy in front of the dev chain's JSON-RPC
// endpoint that understands the bodies (single calls and batches) and
// does what load-balanced, lagging or failing providers do: answer null
// for a receipt that exists, add latency, answer 5xx or reset the
// connection, swallow requests for a while (a blackhole) and, as a node
// some blocks behind, hide the newest blocks.
//
// A lie about one transaction is bounded in time: every null the proxy
// invents for a transaction falls within one burst shorter than
// nullBurst, so that no two invented nulls are REORG_RECHECK_DELAY apart.
// Only the chain itself (a real reorg) may give settle the evidence the
// contract calls "gone".
type rpcProxy struct {
	upstream  string
	listener  net.Listener
	server    *http.Server
	client    *http.Client
	nullBurst time.Duration

	mu sync.Mutex
	// Baseline probabilities, always on.
	nullP, errorP float64
	// Fault windows.
	nullStorm bool // every receipt a lie, within the per-hash budget
	errStorm  float64
	resets    bool
	latency   time.Duration
	lag       uint64
	blackhole chan struct{}
	rng       *rand.Rand
	// bursts: when the proxy first lied about a transaction.
	bursts map[string]time.Time
	stats  rpcStats
}

type rpcStats struct {
	Requests, Calls, Nulls, Errors5xx, Resets, Blackholed, Lagged int
}

func (s rpcStats) String() string {
	return fmt.Sprintf("%d requests (%d calls): %d null receipts invented, %d 5xx, %d resets, %d blackholed, %d lagged answers",
		s.Requests, s.Calls, s.Nulls, s.Errors5xx, s.Resets, s.Blackholed, s.Lagged)
}

// newRPCProxy listens on a free loopback port and forwards to upstream
// (an http:// URL).
func newRPCProxy(t testing.TB, upstream string, seed uint64, nullBurst time.Duration) *rpcProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("rpc proxy: %v", err)
	}
	p := &rpcProxy{
		upstream: upstream, listener: l, nullBurst: nullBurst,
		client: &http.Client{Timeout: rpcUpstreamTimeout},
		rng:    rand.New(rand.NewPCG(seed, 0x6e756c6c)),
		bursts: map[string]time.Time{},
	}
	p.server = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.server.Serve(l) }()
	t.Cleanup(func() {
		p.Heal()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.server.Shutdown(ctx)
	})
	return p
}

// URL is where settle's processes send JSON-RPC.
func (p *rpcProxy) URL() string { return "http://" + p.listener.Addr().String() }

// SetBaseline sets the always-on probabilities of a null receipt and of
// a failed request.
func (p *rpcProxy) SetBaseline(nullP, errorP float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nullP, p.errorP = nullP, errorP
}

// NullStorm answers null for every receipt (each transaction's budget
// allowing) until Heal.
func (p *rpcProxy) NullStorm() { p.mu.Lock(); p.nullStorm = true; p.mu.Unlock() }

// ErrorStorm fails each request with probability prob until Heal: half
// 5xx answers, half connection resets.
func (p *rpcProxy) ErrorStorm(prob float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errStorm = prob
}

// ResetAll resets every request's connection until Heal.
func (p *rpcProxy) ResetAll() { p.mu.Lock(); p.resets = true; p.mu.Unlock() }

// SetLatency delays every request by latency (times 0.5–1.5).
func (p *rpcProxy) SetLatency(latency time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = min(max(latency, 0), rpcLatencyCap)
}

// Lag puts a node blocks behind the head behind the proxy, as behind a
// load balancer: a lagShare of the calls reach it, and the head it
// reports and the blocks, receipts and transactions it shows stop there.
func (p *rpcProxy) Lag(blocks uint64) { p.mu.Lock(); p.lag = blocks; p.mu.Unlock() }

// Blackhole holds every request, answering nothing, until Heal (then the
// held requests go through, late, unless their callers gave up).
func (p *rpcProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole == nil {
		p.blackhole = make(chan struct{})
	}
}

// Heal ends every fault window; the baseline stays.
func (p *rpcProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole != nil {
		close(p.blackhole)
		p.blackhole = nil
	}
	p.nullStorm, p.errStorm, p.resets, p.latency, p.lag = false, 0, false, 0, 0
}

// Stats is what the proxy did so far.
func (p *rpcProxy) Stats() rpcStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

type rpcCall struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

type rpcAnswer struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

// MarshalJSON keeps an explicit null result (omitempty would drop it).
func (a rpcAnswer) MarshalJSON() ([]byte, error) {
	m := map[string]json.RawMessage{"jsonrpc": json.RawMessage(`"2.0"`), "id": a.ID}
	if len(a.ID) == 0 {
		m["id"] = json.RawMessage("null")
	}
	if a.Error != nil {
		m["error"] = a.Error
	} else if a.Result != nil {
		m["result"] = a.Result
	} else {
		m["result"] = json.RawMessage("null")
	}
	return json.Marshal(m)
}

func (p *rpcProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, rpcBodyMax))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.stats.Requests++
	hole, latency := p.blackhole, time.Duration(float64(p.latency)*(0.5+p.rng.Float64()))
	failP := max(p.errorP, p.errStorm)
	fail, reset := p.rng.Float64() < failP, p.resets
	resetNotFail := p.rng.IntN(2) == 0
	if hole != nil {
		p.stats.Blackholed++
	}
	p.mu.Unlock()
	if hole != nil {
		select {
		case <-hole:
		case <-r.Context().Done():
			return
		}
	}
	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-r.Context().Done():
			return
		}
	}
	if reset || (fail && resetNotFail) {
		p.count(func(s *rpcStats) { s.Resets++ })
		resetConn(w)
		return
	}
	if fail {
		p.count(func(s *rpcStats) { s.Errors5xx++ })
		http.Error(w, "upstream unavailable (injected)", http.StatusBadGateway)
		return
	}

	batch := len(bytes.TrimSpace(body)) > 0 && bytes.TrimSpace(body)[0] == '['
	var calls []rpcCall
	if batch {
		err = json.Unmarshal(body, &calls)
	} else {
		var c rpcCall
		err = json.Unmarshal(body, &c)
		calls = []rpcCall{c}
	}
	if err != nil {
		// Not ours to judge: pass it through untouched.
		p.passThrough(w, r, body)
		return
	}
	answers := make([]rpcAnswer, len(calls))
	for i, c := range calls {
		answers[i] = p.forward(r.Context(), c)
	}
	var out []byte
	if batch {
		out, err = json.Marshal(answers)
	} else {
		out, err = json.Marshal(answers[0])
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func (p *rpcProxy) count(f func(*rpcStats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
}

// resetConn answers with a TCP RST instead of an HTTP response.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "reset", http.StatusBadGateway)
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	conn.Close()
}

func (p *rpcProxy) passThrough(w http.ResponseWriter, r *http.Request, body []byte) {
	resp, err := p.post(r.Context(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(resp)
}

func (p *rpcProxy) post(ctx context.Context, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.upstream, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, rpcBodyMax))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream %d", resp.StatusCode)
	}
	return data, nil
}

// call sends one call upstream and returns its answer.
func (p *rpcProxy) call(ctx context.Context, c rpcCall) rpcAnswer {
	params := c.Params
	if params == nil {
		params = []json.RawMessage{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.ID, "method": c.Method, "params": params})
	data, err := p.post(ctx, body)
	if err != nil {
		msg, _ := json.Marshal(map[string]any{"code": -32603, "message": "proxy: " + err.Error()})
		return rpcAnswer{ID: c.ID, Error: msg}
	}
	var a rpcAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		msg, _ := json.Marshal(map[string]any{"code": -32603, "message": "proxy: undecodable upstream answer"})
		return rpcAnswer{ID: c.ID, Error: msg}
	}
	a.ID = c.ID
	return a
}

// forward answers one call: upstream's answer, or a lie.
func (p *rpcProxy) forward(ctx context.Context, c rpcCall) rpcAnswer {
	p.mu.Lock()
	p.stats.Calls++
	lag := p.lag
	if p.rng.Float64() >= lagShare {
		lag = 0 // the load balancer picked the node that keeps up
	}
	p.mu.Unlock()
	var visible uint64 // the lagging node's head; 0: no lag
	if lag > 0 {
		head, err := p.head(ctx)
		if err == nil && head > lag {
			visible = head - lag
		}
	}
	switch c.Method {
	case methodBlockNumber:
		if visible > 0 {
			p.count(func(s *rpcStats) { s.Lagged++ })
			return rpcAnswer{ID: c.ID, Result: quantity(visible)}
		}
	case methodBlockByNum:
		if visible > 0 && len(c.Params) > 0 {
			var tag string
			if json.Unmarshal(c.Params[0], &tag) == nil {
				switch n, err := hexutil.DecodeUint64(tag); {
				case tag == "latest" || tag == "pending":
					c.Params[0] = quantity(visible)
					p.count(func(s *rpcStats) { s.Lagged++ })
				case err == nil && n > visible:
					p.count(func(s *rpcStats) { s.Lagged++ })
					return rpcAnswer{ID: c.ID, Result: json.RawMessage("null")}
				}
			}
		}
	}
	a := p.call(ctx, c)
	if (c.Method != methodReceipt && c.Method != methodTxByHash) || a.Error != nil || isNullJSON(a.Result) || len(c.Params) == 0 {
		return a
	}
	var hash string
	_ = json.Unmarshal(c.Params[0], &hash)
	hash = strings.ToLower(hash)
	var located struct {
		BlockNumber string `json:"blockNumber"`
	}
	_ = json.Unmarshal(a.Result, &located)
	block, _ := hexutil.DecodeUint64(located.BlockNumber)
	behind := visible > 0 && block > visible
	if p.lie(hash, c.Method == methodReceipt, behind) {
		return rpcAnswer{ID: c.ID, Result: json.RawMessage("null")}
	}
	return a
}

// lie decides whether to answer null about a transaction that exists,
// within its burst budget. A lagging node hides it whenever it is beyond
// the lagging head; otherwise only receipts are hidden, at random or in a
// storm.
func (p *rpcProxy) lie(hash string, receipt, behind bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := behind || (receipt && (p.nullStorm || p.rng.Float64() < p.nullP))
	if !want {
		return false
	}
	now := time.Now()
	first, seen := p.bursts[hash]
	if seen && now.Sub(first) >= p.nullBurst {
		return false // this transaction's burst is spent
	}
	if !seen {
		p.bursts[hash] = now
	}
	if behind {
		p.stats.Lagged++
	} else {
		p.stats.Nulls++
	}
	return true
}

func (p *rpcProxy) head(ctx context.Context) (uint64, error) {
	a := p.call(ctx, rpcCall{ID: json.RawMessage("0"), Method: methodBlockNumber})
	if a.Error != nil {
		return 0, errors.New(string(a.Error))
	}
	var s string
	if err := json.Unmarshal(a.Result, &s); err != nil {
		return 0, err
	}
	return hexutil.DecodeUint64(s)
}

func quantity(n uint64) json.RawMessage {
	return json.RawMessage(strconv.Quote(hexutil.EncodeUint64(n)))
}

func isNullJSON(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// TestRPCProxy checks the proxy against a real dev chain: receipts pass
// unchanged, a null lie stays inside its burst, batches are answered
// call by call, errors and resets reach the client, a lagging node hides
// the newest blocks, and a blackhole holds requests until it heals.
func TestRPCProxy(t *testing.T) {
	ctx := context.Background()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	tx, err := ch.SendETH(ctx, 0, "0x1111111111111111111111111111111111111111", big.NewInt(1))
	if err != nil {
		t.Fatal(err)
	}
	const burst = 300 * time.Millisecond
	p := newRPCProxy(t, ch.URL(), 1, burst)
	client, err := ethclient.DialContext(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hash := common.HexToHash(tx.Hash)
	if r, err := client.TransactionReceipt(ctx, hash); err != nil || r.BlockNumber.Uint64() != tx.BlockNumber {
		t.Fatalf("plain receipt: %v %v", r, err)
	}

	p.SetBaseline(1, 0)
	if _, err := client.TransactionReceipt(ctx, hash); !errors.Is(err, ethereum.NotFound) {
		t.Fatalf("null lie: %v", err)
	}
	time.Sleep(burst)
	if _, err := client.TransactionReceipt(ctx, hash); err != nil {
		t.Fatalf("after its burst a transaction is told the truth: %v", err)
	}
	p.SetBaseline(0, 0)

	// A batch: each call answered in its own right.
	rc, err := rpc.DialContext(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var number string
	var receipt map[string]any
	batch := []rpc.BatchElem{
		{Method: methodBlockNumber, Result: &number},
		{Method: methodReceipt, Args: []any{tx.Hash}, Result: &receipt},
	}
	if err := rc.BatchCallContext(ctx, batch); err != nil || batch[0].Error != nil || batch[1].Error != nil || number == "" || receipt["transactionHash"] != tx.Hash {
		t.Fatalf("batch: %v %v %v %q %v", err, batch[0].Error, batch[1].Error, number, receipt)
	}

	p.ErrorStorm(1)
	if _, err := client.BlockNumber(ctx); err == nil {
		t.Fatal("an error storm let a call through")
	}
	p.Heal()
	p.ResetAll()
	if _, err := client.BlockNumber(ctx); err == nil {
		t.Fatal("a reset let a call through")
	}
	p.Heal()

	if err := ch.CommitBlocks(ctx, 3); err != nil {
		t.Fatal(err)
	}
	head, err := ch.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Lag(2)
	heads := map[uint64]int{}
	hidden := 0
	for range 40 {
		got, err := client.BlockNumber(ctx)
		if err != nil {
			t.Fatal(err)
		}
		heads[got]++
		h, err := client.HeaderByNumber(ctx, nil)
		if err != nil || (h.Number.Uint64() != head && h.Number.Uint64() != head-2) {
			t.Fatalf("latest header behind a lagging balancer: %v %v", h, err)
		}
		if _, err := client.HeaderByNumber(ctx, new(big.Int).SetUint64(head)); errors.Is(err, ethereum.NotFound) {
			hidden++
		}
	}
	if len(heads) != 2 || heads[head] == 0 || heads[head-2] == 0 || hidden == 0 || hidden == 40 {
		t.Fatalf("behind the balancer, heads %v (want %d and %d), head block hidden %d of 40 times", heads, head, head-2, hidden)
	}
	p.Heal()

	p.Blackhole()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = client.BlockNumber(short)
	cancel()
	if err == nil {
		t.Fatal("an answer came through the blackhole")
	}
	p.Heal()
	if _, err := client.BlockNumber(ctx); err != nil {
		t.Fatalf("after healing: %v", err)
	}
	if s := p.Stats(); s.Nulls != 1 || s.Resets == 0 || s.Lagged == 0 || s.Blackholed != 1 {
		t.Fatalf("stats: %s", s)
	}
}
