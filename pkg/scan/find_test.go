package scan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
)

// countingRPC is a node that answers from a fixed chain and counts what
// it is asked; it stands for the RPC only (the money path is tested on a
// real chain and database in test/scanner_test.go).
type countingRPC struct {
	mu        sync.Mutex // a pass reads logs and blocks side by side
	logs      []chain.TransferLog
	blocks    map[uint64][]chain.BlockTx
	statuses  map[string]uint64
	calls     map[string]int
	recipient int // most recipients one eth_getLogs carried
	// refuseAbove: a contracts-only eth_getLogs over more blocks, or with
	// more logs than its cap, is refused (0: none refused).
	refuseAbove uint64
	windows     []span // the contracts-only windows answered
}

func (r *countingRPC) FinalityHead(context.Context, chain.Policy) (uint64, bool, error) {
	return 0, false, nil
}

func (r *countingRPC) HeaderByNumber(_ context.Context, number uint64) (chain.Header, error) {
	return chain.Header{Number: number, Hash: fmt.Sprintf("0x%064x", number)}, nil
}

func (r *countingRPC) TransferLogs(_ context.Context, from, to uint64, contracts, recipients []string) ([]chain.TransferLog, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[chain.MethodLogs]++
	r.recipient = max(r.recipient, len(recipients))
	var out []chain.TransferLog
	for _, l := range r.logs {
		if l.BlockNumber >= from && l.BlockNumber <= to && slices.Contains(contracts, l.Contract) && slices.Contains(recipients, l.To) {
			out = append(out, l)
		}
	}
	return out, nil
}

func (r *countingRPC) ContractTransferLogs(_ context.Context, from, to uint64, contracts []string, logsMax int) ([]chain.TransferLog, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[chain.MethodLogs]++
	if r.refuseAbove > 0 && to-from+1 > r.refuseAbove {
		return nil, fmt.Errorf("%w: query returned more than 10000 results", chain.ErrLogsLimit)
	}
	var out []chain.TransferLog
	for _, l := range r.logs {
		if l.BlockNumber >= from && l.BlockNumber <= to && slices.Contains(contracts, l.Contract) {
			out = append(out, l)
		}
	}
	if len(out) > logsMax {
		return nil, fmt.Errorf("%w: %d logs", chain.ErrLogsLimit, len(out))
	}
	r.windows = append(r.windows, span{from, to})
	return out, nil
}

// TransferLogsAt is never reached: these blocks carry no bloom.
func (r *countingRPC) TransferLogsAt(context.Context, string, []string, int) ([]chain.TransferLog, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls["eth_getLogs by hash"]++
	return nil, nil
}

func (r *countingRPC) Blocks(_ context.Context, numbers []uint64) ([]chain.Block, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[chain.MethodBlock] += len(numbers)
	out := make([]chain.Block, len(numbers))
	for i, n := range numbers {
		out[i] = chain.Block{Number: n, Transactions: r.blocks[n]}
	}
	return out, nil
}

func (r *countingRPC) ReceiptStatuses(_ context.Context, txs []chain.MinedTx) (map[string]uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[chain.MethodReceipt] += len(txs)
	out := map[string]uint64{}
	for _, tx := range txs {
		out[tx.Hash] = r.statuses[tx.Hash]
	}
	return out, nil
}

func hash(n int) string { return fmt.Sprintf("0x%064x", n) }
func addr(n int) string { return fmt.Sprintf("0x%040x", n) }

// TestFindWith100000Addresses (SCAN_LOG_WINDOW=off): 500 blocks and 100,000 registered
// addresses cost 100 eth_getLogs, 500 block reads and one receipt per
// native candidate: ≤ 3 calls per block (the target). Every deposit to a
// registered address is found once, with the webhooks' id and amount;
// transfers to others, zero values, reverted transactions and unlisted
// tokens are not.
func TestFindWith100000Addresses(t *testing.T) {
	const network, token, other = "ETH_MAINNET", "0x00000000000000000000000000000000000000aa", "0x00000000000000000000000000000000000000bb"
	registry := payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: network, Decimals: 18},
		{Code: "USDC", Network: network, Contract: token, Decimals: 6},
	})
	const addresses = 100_000
	set := addressSet{owner: map[string]int64{}, complete: true}
	for i := range addresses {
		a := addr(1_000_000 + i)
		set.sorted = append(set.sorted, a)
		set.owner[a] = int64(i + 1)
	}
	rpc := &countingRPC{blocks: map[uint64][]chain.BlockTx{}, statuses: map[string]uint64{}, calls: map[string]int{}}
	rpc.logs = []chain.TransferLog{
		{Transfer: chain.Transfer{Contract: token, To: addr(1_000_000 + 99_999), Value: big.NewInt(1_500_000), LogIndex: 7}, TxHash: hash(1), BlockNumber: 150},
		{Transfer: chain.Transfer{Contract: token, To: addr(5), Value: big.NewInt(1), LogIndex: 0}, TxHash: hash(2), BlockNumber: 151},
		{Transfer: chain.Transfer{Contract: other, To: addr(1_000_000), Value: big.NewInt(1), LogIndex: 0}, TxHash: hash(3), BlockNumber: 152},
		{Transfer: chain.Transfer{Contract: token, To: addr(1_000_000), Value: big.NewInt(0), LogIndex: 1}, TxHash: hash(4), BlockNumber: 152},
	}
	rpc.blocks[200] = []chain.BlockTx{
		{Hash: hash(10), To: addr(1_000_001), Value: big.NewInt(2_000_000_000_000_000_000)},
		{Hash: hash(11), To: addr(1_000_002), Value: big.NewInt(5)}, // reverted
		{Hash: hash(12), To: addr(9), Value: big.NewInt(5)},         // not ours
		{Hash: hash(13), To: addr(1_000_003), Value: big.NewInt(0)}, // a contract call
		{Hash: hash(14), To: "", Value: big.NewInt(5)},              // a creation
	}
	rpc.statuses[hash(10)], rpc.statuses[hash(11)] = 1, 0
	f := finder{network: network, rpc: rpc, registry: registry, addressesPerCall: AddressesPerCallDefault, filteredMax: addressesMax,
		windows: logWindows{filtered: newWindow(BlocksMaxDefault), contracts: newWindow(LogWindowDefault)},
		count:   func(string, int) {}, skipped: func(string, string) { t.Fatal("nothing is out of range here") }}

	events, _, err := f.find(context.Background(), span{101, 600}, set)
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s %d %s %s %s", e.Event.ID, e.Event.UserID, e.Event.Asset, e.Event.Amount, e.ToAddress))
		require.Equal(t, network, e.Event.Network)
		require.Equal(t, payment.Deposit, e.Event.Type)
	}
	require.Equal(t, []string{
		"chain:ETH_MAINNET:" + hash(1) + ":7 100000 USDC 1.5 " + addr(1_099_999),
		"chain:ETH_MAINNET:" + hash(10) + ":native 2 ETH 2 " + addr(1_000_001),
	}, got)

	require.Equal(t, 100, rpc.calls[chain.MethodLogs])
	require.Equal(t, 500, rpc.calls[chain.MethodBlock])
	require.Equal(t, 2, rpc.calls[chain.MethodReceipt], "receipts only of native candidates")
	require.LessOrEqual(t, rpc.recipient, chain.ScanTopicsMax)
	perBlock := float64(rpc.calls[chain.MethodLogs]+rpc.calls[chain.MethodBlock]+rpc.calls[chain.MethodReceipt]+1) / 500
	require.LessOrEqual(t, perBlock, 3.0)
	t.Logf("%.3f RPC calls per block with %d addresses", perBlock, addresses)
}

// TestFindContractWindows: above AddressesPerCall addresses a range is
// read by contract only, in windows, matched by one owners query per
// window of the recipients it found. A window the node refuses is asked
// again at half the size, each block still read once (every deposit
// found once); the window grows back after windowGrowAfter answers; a
// single block over the cap is read by recipient; a transfer to an
// unregistered address among many is ignored.
func TestFindContractWindows(t *testing.T) {
	const network, token = "ETH_MAINNET", "0x00000000000000000000000000000000000000aa"
	registry := payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: network, Decimals: 18},
		{Code: "USDC", Network: network, Contract: token, Decimals: 6},
	})
	const first, last = 1, 500
	registered := map[string]int64{}
	for i := range 100_000 {
		registered[addr(1_000_000+i)] = int64(i + 1)
	}
	rpc := &countingRPC{blocks: map[uint64][]chain.BlockTx{}, statuses: map[string]uint64{}, calls: map[string]int{}}
	var want []string
	for b := uint64(first); b <= last; b++ {
		// Ten transfers a block, one to a registered address.
		for k := range 10 {
			to := addr(int(b)*100 + k) // nobody's
			if k == 3 {
				to = addr(1_000_000 + int(b))
				want = append(want, fmt.Sprintf("chain:%s:%s:%d", network, hash(int(b)), k))
			}
			rpc.logs = append(rpc.logs, chain.TransferLog{
				Transfer: chain.Transfer{Contract: token, To: to, Value: big.NewInt(1_000_000), LogIndex: uint(k)}, TxHash: hash(int(b)), BlockNumber: b,
			})
		}
	}
	// Block 300 is a token airdrop: 500 transfers, more than the cap.
	for k := 10; k < 510; k++ {
		to := addr(900_000 + k)
		if k == 509 {
			to = addr(1_000_000 + 300_000)
			want = append(want, fmt.Sprintf("chain:%s:%s:%d", network, hash(300), k))
		}
		rpc.logs = append(rpc.logs, chain.TransferLog{
			Transfer: chain.Transfer{Contract: token, To: to, Value: big.NewInt(1_000_000), LogIndex: uint(k)}, TxHash: hash(300), BlockNumber: 300,
		})
	}
	registered[addr(1_000_000+300_000)] = 300_001
	rpc.refuseAbove = 30 // the provider's range limit, under SCAN_LOG_WINDOW
	var mu sync.Mutex    // owners is asked by the logs' and the blocks' readers at once
	var lookups, looked int
	all := 0
	f := finder{network: network, rpc: rpc, registry: registry, addressesPerCall: AddressesPerCallDefault, filteredMax: AddressesPerCallDefault,
		logsMax: 400, windows: logWindows{filtered: newWindow(BlocksMaxDefault), contracts: newWindow(LogWindowDefault)},
		owners: func(_ context.Context, addresses []string) (map[string]int64, error) {
			mu.Lock()
			defer mu.Unlock()
			lookups++
			looked = max(looked, len(addresses))
			out := map[string]int64{}
			for _, a := range addresses {
				if u, ok := registered[a]; ok {
					out[a] = u
				}
			}
			return out, nil
		},
		all: func(context.Context) (addressSet, error) {
			all++
			set := addressSet{owner: registered, complete: true}
			for a := range registered {
				set.sorted = append(set.sorted, a)
			}
			slices.Sort(set.sorted)
			return set, nil
		},
		refused: func() {},
		count:   func(string, int) {}, skipped: func(string, string) { t.Fatal("nothing is out of range here") }}

	events, _, err := f.find(context.Background(), span{first, last}, addressSet{})
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		got = append(got, e.Event.ID)
	}
	slices.Sort(got)
	slices.Sort(want)
	require.Equal(t, want, got, "every deposit once, nothing for the others")

	// The windows answered cover first..last once each, in order.
	next := uint64(first)
	for _, w := range rpc.windows {
		if next == 300 {
			next = 301 // the block over the cap, read by recipient
		}
		require.Equal(t, next, w.from, "windows %v", rpc.windows)
		next = w.to + 1
	}
	require.Equal(t, uint64(last+1), next)
	require.Equal(t, 1, all, "one block over the cap loads the set once")
	require.LessOrEqual(t, looked, 400, "an owners query holds one window's recipients")
	sizes := map[uint64]bool{}
	for _, w := range rpc.windows {
		sizes[w.to-w.from+1] = true
	}
	require.True(t, sizes[25], "shrunk from 100 under the range limit of 30: %v", rpc.windows)
	grown := rpc.windows[len(rpc.windows)-2] // the last is the range's rest
	require.GreaterOrEqual(t, grown.to-grown.from+1, uint64(16), "the window grows back after the airdrop block: %v", rpc.windows)
	logsCalls := rpc.calls[chain.MethodLogs]
	perBlock := float64(logsCalls+rpc.calls[chain.MethodBlock]+rpc.calls[chain.MethodReceipt]+1) / last
	t.Logf("%d eth_getLogs (%d windows answered, %d owners queries), %.3f RPC calls per block", logsCalls, len(rpc.windows), lookups, perBlock)
	require.LessOrEqual(t, perBlock, 3.0)
}

// TestWindow: halved on a refusal down to one block, doubled back after
// windowGrowAfter answers of its full size, never past its maximum.
func TestWindow(t *testing.T) {
	w := newWindow(100)
	w.refused(100)
	require.Equal(t, uint64(50), w.size())
	w.refused(7) // a short window refused: half of it
	require.Equal(t, uint64(3), w.size())
	for range 10 {
		w.refused(w.size())
	}
	require.Equal(t, uint64(1), w.size())
	for range windowGrowAfter - 1 {
		w.answered(1)
	}
	require.Equal(t, uint64(1), w.size())
	w.answered(1)
	require.Equal(t, uint64(2), w.size())
	w.answered(1) // shorter than the window: says nothing
	for range 10 * windowGrowAfter {
		w.answered(w.size())
	}
	require.Equal(t, uint64(100), w.size())
	require.Equal(t, uint64(1), newWindow(0).size())
}

// overlapRPC holds each read until the pass has `together` reads open
// at once (its token logs and its block batches), and records the most
// reads open together.
type overlapRPC struct {
	*countingRPC
	together       int
	mu             sync.Mutex
	open, most     int
	overlapped     chan struct{}
	overlappedOnce sync.Once
}

func (r *overlapRPC) enter() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open++
	r.most = max(r.most, r.open)
	if r.open >= r.together {
		r.overlappedOnce.Do(func() { close(r.overlapped) })
	}
}

func (r *overlapRPC) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open--
}

// wait: until the reads overlapped once; a pass that reads in turn never
// gets there, and the read fails instead of hanging the test.
func (r *overlapRPC) wait(ctx context.Context) error {
	select {
	case <-r.overlapped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		return fmt.Errorf("reads never overlapped: %d open at most", r.most)
	}
}

func (r *overlapRPC) ContractTransferLogs(ctx context.Context, from, to uint64, contracts []string, logsMax int) ([]chain.TransferLog, error) {
	r.enter()
	defer r.leave()
	if err := r.wait(ctx); err != nil {
		return nil, err
	}
	return r.countingRPC.ContractTransferLogs(ctx, from, to, contracts, logsMax)
}

func (r *overlapRPC) Blocks(ctx context.Context, numbers []uint64) ([]chain.Block, error) {
	r.enter()
	defer r.leave()
	if err := r.wait(ctx); err != nil {
		return nil, err
	}
	return r.countingRPC.Blocks(ctx, numbers)
}

// TestFindOverlapsReads: a pass asks its token logs and
// SCAN_BATCHES_IN_FLIGHT block batches at once (a remote node's latency
// is paid once per round, not per request), never more, and still
// returns every deposit once in block order.
func TestFindOverlapsReads(t *testing.T) {
	for _, inFlight := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("batches=%d", inFlight), func(t *testing.T) { testFindOverlapsReads(t, inFlight) })
	}
}

func testFindOverlapsReads(t *testing.T, inFlight int) {
	const network, token = "ETH_MAINNET", "0x00000000000000000000000000000000000000aa"
	registry := payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: network, Decimals: 18},
		{Code: "USDC", Network: network, Contract: token, Decimals: 6},
	})
	const first, last = 1, 6 * chain.ScanBatchMax
	set := addressSet{owner: map[string]int64{}, complete: true}
	together := 1 + cmp.Or(inFlight, BatchesInFlightDefault) // 0: the default
	rpc := &overlapRPC{together: together, overlapped: make(chan struct{}), countingRPC: &countingRPC{
		blocks: map[uint64][]chain.BlockTx{}, statuses: map[string]uint64{}, calls: map[string]int{},
	}}
	var want []string
	for b := first; b <= last; b += 7 {
		to := addr(1_000_000 + b)
		set.sorted = append(set.sorted, to)
		set.owner[to] = int64(b)
		rpc.logs = append(rpc.logs, chain.TransferLog{
			Transfer: chain.Transfer{Contract: token, To: to, Value: big.NewInt(1_000_000), LogIndex: 0}, TxHash: hash(b), BlockNumber: uint64(b),
		})
		want = append(want, fmt.Sprintf("chain:%s:%s:0", network, hash(b)))
	}
	var native []string
	for b := first; b <= last; b += 7 {
		h := hash(10_000 + b)
		rpc.blocks[uint64(b)] = []chain.BlockTx{{Hash: h, To: addr(1_000_000 + b), Value: big.NewInt(1)}}
		rpc.statuses[h] = 1
		native = append(native, fmt.Sprintf("chain:%s:%s:native", network, h))
	}
	want = append(want, native...)
	slices.Sort(set.sorted)
	f := finder{network: network, rpc: rpc, registry: registry, addressesPerCall: AddressesPerCallDefault, filteredMax: 0,
		logsMax: 10_000, batchesInFlight: inFlight, windows: logWindows{filtered: newWindow(BlocksMaxDefault), contracts: newWindow(LogWindowDefault)},
		refused: func() {}, count: func(string, int) {}, skipped: func(string, string) { t.Fatal("nothing is out of range here") }}

	events, _, err := f.find(context.Background(), span{first, last}, set)
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		got = append(got, e.Event.ID)
	}
	require.Equal(t, want, got, "token deposits then native, each in block order")
	require.Equal(t, last, rpc.calls[chain.MethodBlock], "each block read once")
	require.Equal(t, together, rpc.most, "the logs and the batches in flight open together, never more")
}

// failingRPC fails the range's first block batch once the pass has
// asked all it may at once, and holds every other until its context
// ends, counting the batches asked.
type failingRPC struct {
	*countingRPC
	first   uint64
	batches atomic.Int32
	full    chan struct{} // closed at BatchesInFlightDefault batches
}

var errNodeDown = errors.New("node down")

func (r *failingRPC) Blocks(ctx context.Context, numbers []uint64) ([]chain.Block, error) {
	if r.batches.Add(1) == BatchesInFlightDefault {
		close(r.full)
	}
	if numbers[0] == r.first {
		select {
		case <-r.full:
		case <-time.After(10 * time.Second):
		}
		return nil, errNodeDown
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestFindStopsAfterAFailedRead: a failed block batch is the pass's
// error, the batches under way are cancelled, and none is asked after it.
func TestFindStopsAfterAFailedRead(t *testing.T) {
	const network = "ETH_MAINNET"
	registry := payment.NewRegistry([]payment.Asset{{Code: "ETH", Network: network, Decimals: 18}})
	rpc := &failingRPC{first: 1, full: make(chan struct{}), countingRPC: &countingRPC{blocks: map[uint64][]chain.BlockTx{}, statuses: map[string]uint64{}, calls: map[string]int{}}}
	f := finder{network: network, rpc: rpc, registry: registry, count: func(string, int) {}}
	set := addressSet{sorted: []string{addr(1)}, owner: map[string]int64{addr(1): 1}, complete: true}

	_, _, err := f.nativeEvents(context.Background(), span{1, 10 * chain.ScanBatchMax}, set)
	require.ErrorIs(t, err, errNodeDown)
	require.Equal(t, int32(BatchesInFlightDefault), rpc.batches.Load(), "the batches open when the first failed, and no more")
}
