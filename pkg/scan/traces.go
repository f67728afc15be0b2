package scan

import (
	"context"
	"errors"
	"fmt"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TraceRPC is what the trace scan (Options.Traces) asks a network's node
// besides RPC; *chain.Client implements it.
type TraceRPC interface {
	InternalTransfers(ctx context.Context, numbers []uint64) ([]chain.InternalTransfer, error)
	InternalTransfersAt(ctx context.Context, blocks []chain.BlockID) ([]chain.InternalTransfer, error)
}

// TracesByHash tells whether passes under p trace the blocks they read by
// hash (debug_traceBlockByHash; see internalEvents): where their blocks
// are linked into one chain.
func TracesByHash(p chain.Policy) bool { return linksBlocks(p) }

// errNoTraceRPC: Options.Traces with a node client that cannot trace.
var errNoTraceRPC = errors.New("scan traces: the network's rpc client cannot trace blocks")

// findAll is what a pass reads: the finder's transfers, then, under
// Options.Traces, the internal ones from the same range and addresses.
func (s *Scanner) findAll(ctx context.Context, f finder, r span, addrs addressSet) ([]postgres.NewEvent, []chain.Block, error) {
	events, blocks, err := f.find(ctx, r, addrs)
	if err != nil || !s.opts.Traces || len(addrs.sorted) == 0 {
		return events, blocks, err
	}
	internal, err := f.internalEvents(ctx, r, addrs, blocks)
	if err != nil {
		return nil, nil, err
	}
	return append(events, internal...), blocks, nil
}

// internalEvents traces the range in batches of chain.TraceBatchMax
// blocks (one debug_traceBlockByNumber per block) and makes the deposit
// of each internal transfer to a registered address whose transaction's
// receipt says success: the index is the one Alchemy's internal activity
// gives (trace:<typeTraceAddress>), so the two make one event. A pass
// that links its blocks (f.blocks: read, the range's, in order) traces
// each by its hash instead, and asks its receipts by that hash: traced
// by number, a backend on another branch of a fork would answer its own
// block there, and a transfer the block read holds would never be found.
func (f finder) internalEvents(ctx context.Context, r span, addrs addressSet, blocks []chain.Block) ([]postgres.NewEvent, error) {
	asset, ok := f.registry.Native(f.network)
	if !ok {
		return nil, nil
	}
	tracer, ok := f.rpc.(TraceRPC)
	if !ok {
		return nil, errNoTraceRPC
	}
	type candidate struct {
		transfer chain.InternalTransfer
		user     int64
	}
	var candidates []candidate
	// Genesis has no transactions, and nodes refuse to trace it.
	for start := max(r.from, 1); start <= r.to; start += chain.TraceBatchMax {
		end := min(r.to, start+chain.TraceBatchMax-1)
		numbers := make([]uint64, 0, end-start+1)
		for n := start; n <= end; n++ {
			numbers = append(numbers, n)
		}
		var found []chain.InternalTransfer
		var err error
		if f.blocks {
			found, err = f.traceAt(ctx, tracer, r, blocks, numbers)
		} else {
			found, err = tracer.InternalTransfers(ctx, numbers)
			f.count(chain.MethodTraceBlock, len(numbers))
		}
		if err != nil {
			return nil, err
		}
		for _, t := range found {
			if user, ok := addrs.owner[t.To]; ok && t.BlockNumber >= r.from && t.BlockNumber <= r.to {
				candidates = append(candidates, candidate{t, user})
			}
		}
		if end == r.to {
			break // r.to may be the largest block number: no overflow
		}
	}
	// The trace already leaves out a failed transaction (its own frame
	// has an error); the receipt is the chain's word on it, as for
	// native transfers, and costs calls only for the few candidates.
	var out []postgres.NewEvent
	for _, c := range chunks(len(candidates), chain.ScanBatchMax) {
		seen := map[string]bool{}
		var txs []chain.MinedTx
		for _, cand := range candidates[c[0]:c[1]] {
			if !seen[cand.transfer.TxHash] {
				seen[cand.transfer.TxHash] = true
				txs = append(txs, chain.MinedTx{Hash: cand.transfer.TxHash, BlockHash: cand.transfer.BlockHash, BlockNumber: cand.transfer.BlockNumber})
			}
		}
		statuses, err := f.rpc.ReceiptStatuses(ctx, txs)
		f.count(chain.MethodReceipt, len(txs))
		if err != nil {
			return nil, err
		}
		for _, cand := range candidates[c[0]:c[1]] {
			if statuses[cand.transfer.TxHash] != 1 {
				continue
			}
			t := cand.transfer
			if e, ok := f.event(cand.user, asset, t.BlockNumber, t.TxHash, payment.TraceTransfer(t.TraceAddress), t.To, t.Value); ok {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// traceAt traces the blocks read at these numbers by their hashes.
func (f finder) traceAt(ctx context.Context, tracer TraceRPC, r span, blocks []chain.Block, numbers []uint64) ([]chain.InternalTransfer, error) {
	at := make([]chain.BlockID, 0, len(numbers))
	for _, n := range numbers {
		i := n - r.from
		if i >= uint64(len(blocks)) || blocks[i].Number != n {
			return nil, fmt.Errorf("scan %s: block %d to trace not among the blocks read", f.network, n)
		}
		at = append(at, chain.BlockID{Number: n, Hash: blocks[i].Hash})
	}
	found, err := tracer.InternalTransfersAt(ctx, at)
	f.count(chain.MethodTraceBlockByHash, len(at))
	return found, err
}
