package scan

import (
	"context"
	"errors"
	"fmt"
	"math/big"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// RPC is what a scan asks a network's node; *chain.Client implements it.
type RPC interface {
	FinalityHead(ctx context.Context, p chain.Policy) (uint64, bool, error)
	TransferLogs(ctx context.Context, from, to uint64, contracts, recipients []string) ([]chain.TransferLog, error)
	Blocks(ctx context.Context, numbers []uint64) ([]chain.Block, error)
	ReceiptStatuses(ctx context.Context, txHashes []string) (map[string]uint64, error)
}

// addressSet is a network's registered addresses, sorted, with owners.
type addressSet struct {
	sorted []string
	owner  map[string]int64
}

// finder reads one range of one network for one address set.
type finder struct {
	network          string
	rpc              RPC
	registry         *payment.Registry
	addressesPerCall int
	traceID          string
	count            func(method string, n int)
	// skipped reports a transfer that cannot become a deposit (an amount
	// out of range): a human must look.
	skipped func(eventID, why string)
}

// find returns the deposit events of the range, in block order: token
// transfers from eth_getLogs (by contract, recipients chunked), native
// value from the blocks' own transactions with a successful receipt.
func (f finder) find(ctx context.Context, r span, addrs addressSet) ([]postgres.NewEvent, error) {
	if len(addrs.sorted) == 0 {
		return nil, nil
	}
	var out []postgres.NewEvent
	tokens, err := f.tokenEvents(ctx, r, addrs)
	if err != nil {
		return nil, err
	}
	out = append(out, tokens...)
	native, err := f.nativeEvents(ctx, r, addrs)
	if err != nil {
		return nil, err
	}
	return append(out, native...), nil
}

// tokens are the network's listed token contracts.
func (f finder) tokens() []string {
	var out []string
	for _, a := range f.registry.Tokens(f.network) {
		out = append(out, a.Contract)
	}
	return out
}

func (f finder) tokenEvents(ctx context.Context, r span, addrs addressSet) ([]postgres.NewEvent, error) {
	contracts := f.tokens()
	var out []postgres.NewEvent
	for _, cc := range chunks(len(contracts), chain.ScanContractsMax) {
		for _, ac := range chunks(len(addrs.sorted), min(f.addressesPerCall, chain.ScanTopicsMax)) {
			logs, err := f.rpc.TransferLogs(ctx, r.from, r.to, contracts[cc[0]:cc[1]], addrs.sorted[ac[0]:ac[1]])
			f.count(chain.MethodLogs, 1)
			if err != nil {
				return nil, err
			}
			for _, l := range logs {
				user, ok := addrs.owner[l.To]
				asset, listed := f.registry.ByContract(f.network, l.Contract)
				if !ok || !listed || l.BlockNumber < r.from || l.BlockNumber > r.to {
					continue // not asked for: a node that ignores part of the filter
				}
				if e, ok := f.event(user, asset, l.TxHash, payment.LogIndexTransfer(uint64(l.LogIndex)), l.To, l.Value); ok {
					out = append(out, e)
				}
			}
		}
	}
	return out, nil
}

func (f finder) nativeEvents(ctx context.Context, r span, addrs addressSet) ([]postgres.NewEvent, error) {
	asset, ok := f.registry.Native(f.network)
	if !ok {
		return nil, nil
	}
	type candidate struct {
		tx   chain.BlockTx
		user int64
	}
	var candidates []candidate
	for start := r.from; start <= r.to; start += chain.ScanBatchMax {
		end := min(r.to, start+chain.ScanBatchMax-1)
		numbers := make([]uint64, 0, end-start+1)
		for n := start; n <= end; n++ {
			numbers = append(numbers, n)
		}
		blocks, err := f.rpc.Blocks(ctx, numbers)
		f.count(chain.MethodBlock, len(numbers))
		if err != nil {
			return nil, err
		}
		for _, b := range blocks {
			for _, tx := range b.Transactions {
				if user, ok := addrs.owner[tx.To]; ok && tx.To != "" && tx.Value.Sign() > 0 {
					candidates = append(candidates, candidate{tx, user})
				}
			}
		}
	}
	var out []postgres.NewEvent
	for _, c := range chunks(len(candidates), chain.ScanBatchMax) {
		hashes := make([]string, 0, c[1]-c[0])
		for _, cand := range candidates[c[0]:c[1]] {
			hashes = append(hashes, cand.tx.Hash)
		}
		statuses, err := f.rpc.ReceiptStatuses(ctx, hashes)
		f.count(chain.MethodReceipt, len(hashes))
		if err != nil {
			return nil, err
		}
		for _, cand := range candidates[c[0]:c[1]] {
			if statuses[cand.tx.Hash] != 1 {
				continue // a reverted transaction moved no value
			}
			if e, ok := f.event(cand.user, asset, cand.tx.Hash, payment.TransferNative, cand.tx.To, cand.tx.Value); ok {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// event is the deposit the provider webhooks make for the same transfer
// (httpapi's intake): same id, same content (type, user, asset, amount,
// tx_hash, transfer_index, network; the content hash covers neither
// source nor trace id), so whichever arrives first wins and the other is
// a duplicate.
func (f finder) event(user int64, asset payment.Asset, txHash, index, to string, value *big.Int) (postgres.NewEvent, bool) {
	id := payment.Transfer{Network: f.network, TxHash: txHash, Index: index}.EventID()
	amount, err := money.FromBaseUnits("0x"+value.Text(16), asset.Decimals)
	switch {
	case errors.Is(err, money.ErrNotPositive):
		return postgres.NewEvent{}, false
	case err != nil:
		f.skipped(id, fmt.Sprintf("amount of %s base units: %v", value, err))
		return postgres.NewEvent{}, false
	}
	return postgres.NewEvent{
		Event: payment.Event{
			ID: id, Type: payment.Deposit, UserID: user, Asset: asset.Code, Amount: amount,
			TxHash: txHash, TransferIndex: index, TraceID: f.traceID, Network: f.network,
		},
		Source:    postgres.SourceScanner,
		ToAddress: to,
	}, true
}
