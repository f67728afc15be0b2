package scan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"

	"golang.org/x/sync/errgroup"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// RPC is what a scan asks a network's node; *chain.Client implements it.
type RPC interface {
	FinalityHead(ctx context.Context, p chain.Policy) (uint64, bool, error)
	HeaderByNumber(ctx context.Context, number uint64) (chain.Header, error)
	TransferLogs(ctx context.Context, from, to uint64, contracts, recipients []string) ([]chain.TransferLog, error)
	ContractTransferLogs(ctx context.Context, from, to uint64, contracts []string, logsMax int) ([]chain.TransferLog, error)
	TransferLogsAt(ctx context.Context, blockHash string, contracts []string, logsMax int) ([]chain.TransferLog, error)
	Blocks(ctx context.Context, numbers []uint64) ([]chain.Block, error)
	ReceiptStatuses(ctx context.Context, txs []chain.MinedTx) (map[string]uint64, error)
}

// addressSet is a network's registered addresses, sorted, with owners,
// when they are few (or a backfill's one): complete. Otherwise it is
// empty and the recipients a window finds are looked up in the store.
type addressSet struct {
	sorted   []string
	owner    map[string]int64
	complete bool
}

// ownersLookupMax bounds the addresses of one owners query (= ANY($2)).
const ownersLookupMax = 10_000

// logWindows are a network's two eth_getLogs windows: the
// recipient-filtered query's (up to SCAN_BLOCKS_MAX: its answer holds
// only deposits) and the contracts-only query's (SCAN_LOG_WINDOW: its
// answer holds every transfer of the listed tokens).
type logWindows struct {
	filtered, contracts *window
}

// finder reads one range of one network for one address set.
type finder struct {
	network          string
	rpc              RPC
	registry         *payment.Registry
	addressesPerCall int
	// filteredMax: a complete set of at most this many addresses is asked
	// for by recipient; more, or an incomplete set, by contract only.
	filteredMax int
	// logsMax caps a contracts-only answer (SCAN_LOGS_MAX).
	logsMax int
	// batchesInFlight bounds the block batches (chain.ScanBatchMax blocks
	// each) asked and not yet answered (SCAN_BATCHES_IN_FLIGHT; 0: the
	// default); with the token logs read beside them, a pass has at most
	// one more request open.
	batchesInFlight int
	windows         logWindows
	// owners looks recipients up in the store; all loads the complete set
	// (a block too busy for the contracts-only query reads it filtered).
	owners  func(ctx context.Context, addresses []string) (map[string]int64, error)
	all     func(ctx context.Context) (addressSet, error)
	refused func()
	traceID string
	count   func(method string, n int)
	// skipped reports a transfer that cannot become a deposit (an amount
	// out of range): a human must look.
	skipped func(eventID, why string)
	// blocks: read every block of the range, even with no native coin or
	// no address (the cursor links them into one chain, see link).
	blocks bool
}

// find returns the deposit events of the range, in block order: token
// transfers from eth_getLogs (by contract, and by recipient when the set
// is complete), native value from the blocks' own transactions with a
// successful receipt; and the blocks it read, in order.
func (f finder) find(ctx context.Context, r span, addrs addressSet) ([]postgres.NewEvent, []chain.Block, error) {
	if addrs.complete && len(addrs.sorted) == 0 {
		if !f.blocks {
			return nil, nil, nil
		}
		_, blocks, err := f.nativeEvents(ctx, r, addrs)
		return nil, blocks, err
	}
	// Token logs and blocks are independent questions: asked side by side,
	// a pass waits for the slower of them, not for both in turn.
	var tokens, native []postgres.NewEvent
	var blocks []chain.Block
	read := readLogs{present: map[blockContract]bool{}, verified: map[uint64]bool{}}
	if f.blocks {
		read.from = map[chain.BlockID]bool{} // see logsOnBlocks
	}
	filtered := addrs.complete && len(addrs.sorted) <= f.filteredMax
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		if filtered {
			tokens, err = f.filteredTokenEvents(gctx, r, addrs, &read)
		} else {
			tokens, err = f.contractTokenEvents(gctx, r, addrs, &read)
		}
		return err
	})
	g.Go(func() (err error) {
		native, blocks, err = f.nativeEvents(gctx, r, addrs)
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	if f.blocks {
		if err := f.logsOnBlocks(r, blocks, &read); err != nil {
			return nil, nil, err
		}
	}
	if err := f.checkLogs(ctx, blocks, tokens, addrs, filtered, &read); err != nil {
		return nil, nil, err
	}
	return append(tokens, native...), blocks, nil
}

// blockContract names a token contract's logs in one block.
type blockContract struct {
	block    uint64
	contract string
}

// readLogs is what a pass's eth_getLogs answers held: which contracts
// had a Transfer log in which block, the blocks they named (when the
// pass links its blocks), and the blocks read whole by recipient (too
// busy for the contracts-only query).
type readLogs struct {
	present  map[blockContract]bool
	verified map[uint64]bool
	from     map[chain.BlockID]bool
}

func (r *readLogs) add(logs []chain.TransferLog) {
	for _, l := range logs {
		r.present[blockContract{l.BlockNumber, l.Contract}] = true
		if r.from != nil {
			r.from[chain.BlockID{Number: l.BlockNumber, Hash: l.BlockHash}] = true
		}
	}
}

// logsOnBlocks holds the range's eth_getLogs answers to the blocks the
// pass read (and links into one chain): every log must name the block
// read at its height. Behind a balancer the logs can come from a backend
// on another branch of a fork: their deposits are not on the chain the
// pass records, and a block's Transfer of a token there would stand in
// checkLogs for the logs of the block read, whose deposits would then be
// passed for good. So the pass fails and runs again. Every log names its
// block: no call.
func (f finder) logsOnBlocks(r span, blocks []chain.Block, read *readLogs) error {
	for at := range read.from {
		if at.Number < r.from || at.Number > r.to {
			continue // outside the range: never made a deposit
		}
		i := at.Number - r.from
		if i >= uint64(len(blocks)) || blocks[i].Number != at.Number {
			return fmt.Errorf("scan %s: block %d of a log not among the blocks read", f.network, at.Number)
		}
		if at.Hash != blocks[i].Hash {
			return payment.Unavailable("scan "+f.network, fmt.Errorf(
				"eth_getLogs answered logs of block %d %s, the block read there is %s: backends on different branches; the pass runs again",
				at.Number, cmp.Or(at.Hash, "(no block hash)"), blocks[i].Hash))
		}
	}
	return nil
}

// checkLogs holds the range's eth_getLogs answers to the blocks' own
// blooms. A backend behind a balancer whose log index lags answers an
// empty list for blocks it has not indexed, and the cursor would pass
// their deposits for good. A block whose bloom admits a Transfer of a
// listed token (to a registered address, when asked by recipient) that
// the answer lacks is asked again by its hash (EIP-234: a node without
// the block errs instead of answering empty); a deposit there that the
// range answer missed fails the pass, which runs again. Blooms have no
// false negatives, so no deposit escapes; their false positives cost one
// call each. Blocks come with the native reads: a network without a
// listed native coin reads none, and is not checked.
func (f finder) checkLogs(ctx context.Context, blocks []chain.Block, tokens []postgres.NewEvent, addrs addressSet, filtered bool, read *readLogs) error {
	contracts := f.tokens()
	var recipients []string
	if filtered {
		recipients = addrs.sorted
	}
	var known map[string]bool
	for _, b := range blocks {
		if !b.HasBloom || read.verified[b.Number] {
			continue // no bloom to hold the answer to (every node sends one)
		}
		suspect := false
		for _, c := range contracts {
			if !read.present[blockContract{b.Number, c}] && b.MayHoldTransfer(c, recipients) {
				suspect = true
				break
			}
		}
		if !suspect {
			continue
		}
		if known == nil {
			known = make(map[string]bool, len(tokens))
			for _, e := range tokens {
				known[e.Event.ID] = true
			}
		}
		if err := f.checkBlock(ctx, b, contracts, addrs, known); err != nil {
			return err
		}
	}
	return nil
}

// checkBlock asks for a suspect block's Transfer logs by its hash and
// fails if they hold a deposit the range answer lacked.
func (f finder) checkBlock(ctx context.Context, b chain.Block, contracts []string, addrs addressSet, known map[string]bool) error {
	for _, cc := range chunks(len(contracts), chain.ScanContractsMax) {
		logs, err := f.rpc.TransferLogsAt(ctx, b.Hash, contracts[cc[0]:cc[1]], f.logsMax)
		f.count(chain.MethodLogs, 1)
		if errors.Is(err, chain.ErrLogsLimit) {
			return nil // a block that busy was indexed: the node has its logs
		}
		if err != nil {
			return err
		}
		deposits, err := f.depositsOf(ctx, span{b.Number, b.Number}, logs, addrs)
		if err != nil {
			return err
		}
		for _, e := range deposits {
			if !known[e.Event.ID] {
				return payment.Unavailable("scan "+f.network, fmt.Errorf(
					"eth_getLogs over the range answered without deposit %s of block %d, which the block holds: a lagging backend; the pass runs again", e.Event.ID, b.Number))
			}
		}
	}
	return nil
}

// tokens are the network's listed token contracts.
func (f finder) tokens() []string {
	var out []string
	for _, a := range f.registry.Tokens(f.network) {
		out = append(out, a.Contract)
	}
	return out
}

// filteredTokenEvents asks for the transfers to the set's addresses,
// recipients chunked, in windows of up to the pass.
func (f finder) filteredTokenEvents(ctx context.Context, r span, addrs addressSet, read *readLogs) ([]postgres.NewEvent, error) {
	var out []postgres.NewEvent
	err := windowed(ctx, r, f.windows.filtered, f.refused, func(ctx context.Context, w span) error {
		events, err := f.filteredWindow(ctx, w, addrs, read)
		out = append(out, events...)
		return err
	}, nil)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (f finder) filteredWindow(ctx context.Context, r span, addrs addressSet, read *readLogs) ([]postgres.NewEvent, error) {
	contracts := f.tokens()
	var out []postgres.NewEvent
	for _, cc := range chunks(len(contracts), chain.ScanContractsMax) {
		for _, ac := range chunks(len(addrs.sorted), min(f.addressesPerCall, chain.ScanTopicsMax)) {
			logs, err := f.rpc.TransferLogs(ctx, r.from, r.to, contracts[cc[0]:cc[1]], addrs.sorted[ac[0]:ac[1]])
			f.count(chain.MethodLogs, 1)
			if err != nil {
				return nil, err
			}
			read.add(logs)
			out = append(out, f.tokenDeposits(r, logs, addrs.owner)...)
		}
	}
	return out, nil
}

// contractTokenEvents asks for every transfer of the listed contracts in
// windows of SCAN_LOG_WINDOW blocks and keeps those to registered
// addresses: one call per window whatever the number of addresses, and
// one owners query of the window's distinct recipients.
func (f finder) contractTokenEvents(ctx context.Context, r span, addrs addressSet, seen *readLogs) ([]postgres.NewEvent, error) {
	contracts := f.tokens()
	var out []postgres.NewEvent
	for _, cc := range chunks(len(contracts), chain.ScanContractsMax) {
		read := func(ctx context.Context, w span) error {
			logs, err := f.rpc.ContractTransferLogs(ctx, w.from, w.to, contracts[cc[0]:cc[1]], f.logsMax)
			f.count(chain.MethodLogs, 1)
			if err != nil {
				return err
			}
			seen.add(logs)
			deposits, err := f.depositsOf(ctx, w, logs, addrs)
			out = append(out, deposits...)
			return err
		}
		// A block whose transfers alone pass the cap: its deposits, asked
		// by recipient (rare, and costs a call per SCAN_ADDRESSES_PER_CALL
		// addresses).
		single := func(ctx context.Context, w span) error {
			all := addrs
			if !all.complete {
				var err error
				if all, err = f.all(ctx); err != nil {
					return err
				}
			}
			events, err := f.filteredWindow(ctx, w, all, seen)
			for n := w.from; n <= w.to; n++ {
				seen.verified[n] = true // its logs were too many to be missing
			}
			out = append(out, events...)
			return err
		}
		if err := windowed(ctx, r, f.windows.contracts, f.refused, read, single); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tokenDeposits are the logs' deposits: to an owned address, of a listed
// token, inside the range asked (a node may ignore part of a filter).
func (f finder) tokenDeposits(r span, logs []chain.TransferLog, owners map[string]int64) []postgres.NewEvent {
	var out []postgres.NewEvent
	for _, l := range logs {
		user, ok := owners[l.To]
		asset, listed := f.registry.ByContract(f.network, l.Contract)
		if !ok || !listed || l.BlockNumber < r.from || l.BlockNumber > r.to {
			continue
		}
		if e, ok := f.event(user, asset, l.BlockNumber, l.TxHash, payment.LogIndexTransfer(uint64(l.LogIndex)), l.To, l.Value); ok {
			out = append(out, e)
		}
	}
	return out
}

// depositsOf are the logs' deposits, their recipients' owners looked up.
func (f finder) depositsOf(ctx context.Context, r span, logs []chain.TransferLog, addrs addressSet) ([]postgres.NewEvent, error) {
	recipients := make([]string, 0, len(logs))
	for _, l := range logs {
		recipients = append(recipients, l.To)
	}
	owners, err := f.ownersOf(ctx, addrs, recipients)
	if err != nil {
		return nil, err
	}
	return f.tokenDeposits(r, logs, owners), nil
}

// ownersOf maps recipients to owners: from the set when it is complete,
// else from the store.
func (f finder) ownersOf(ctx context.Context, addrs addressSet, recipients []string) (map[string]int64, error) {
	if addrs.complete {
		return addrs.owner, nil
	}
	return f.lookup(ctx, recipients)
}

// lookup maps the distinct addresses among these to their owners, in
// bounded queries.
func (f finder) lookup(ctx context.Context, addresses []string) (map[string]int64, error) {
	seen := make(map[string]bool, len(addresses))
	distinct := make([]string, 0, len(addresses))
	for _, a := range addresses {
		if a != "" && !seen[a] {
			seen[a] = true
			distinct = append(distinct, a)
		}
	}
	out := map[string]int64{}
	for _, c := range chunks(len(distinct), ownersLookupMax) {
		owners, err := f.owners(ctx, distinct[c[0]:c[1]])
		if err != nil {
			return nil, err
		}
		for a, u := range owners {
			out[a] = u
		}
	}
	return out, nil
}

func (f finder) nativeEvents(ctx context.Context, r span, addrs addressSet) ([]postgres.NewEvent, []chain.Block, error) {
	asset, native := f.registry.Native(f.network)
	if !native && !f.blocks {
		return nil, nil, nil
	}
	type candidate struct {
		tx    chain.BlockTx
		block chain.Block
		user  int64
	}
	// Batches are read batchesInFlight at a time, their candidates kept
	// in block order.
	var batches []span
	for start := r.from; start <= r.to; start += chain.ScanBatchMax {
		batches = append(batches, span{start, min(r.to, start+chain.ScanBatchMax-1)})
	}
	found := make([][]candidate, len(batches))
	read := make([][]chain.Block, len(batches))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cmp.Or(f.batchesInFlight, BatchesInFlightDefault))
	for i, batch := range batches {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err // another batch failed: ask nothing more
			}
			numbers := make([]uint64, 0, batch.to-batch.from+1)
			for n := batch.from; n <= batch.to; n++ {
				numbers = append(numbers, n)
			}
			blocks, err := f.rpc.Blocks(gctx, numbers)
			f.count(chain.MethodBlock, len(numbers))
			if err != nil {
				return err
			}
			read[i] = blocks
			if !native {
				return nil // read for the chain only
			}
			var recipients []string
			for _, b := range blocks {
				for _, tx := range b.Transactions {
					if tx.Value.Sign() > 0 {
						recipients = append(recipients, tx.To)
					}
				}
			}
			owners, err := f.ownersOf(gctx, addrs, recipients)
			if err != nil {
				return err
			}
			for _, b := range blocks {
				for _, tx := range b.Transactions {
					if user, ok := owners[tx.To]; ok && tx.To != "" && tx.Value.Sign() > 0 {
						found[i] = append(found[i], candidate{tx, b, user})
					}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	var blocks []chain.Block
	for _, b := range read {
		blocks = append(blocks, b...)
	}
	var candidates []candidate
	for _, c := range found {
		candidates = append(candidates, c...)
	}
	var out []postgres.NewEvent
	for _, c := range chunks(len(candidates), chain.ScanBatchMax) {
		txs := make([]chain.MinedTx, 0, c[1]-c[0])
		for _, cand := range candidates[c[0]:c[1]] {
			txs = append(txs, chain.MinedTx{Hash: cand.tx.Hash, BlockHash: cand.block.Hash, BlockNumber: cand.block.Number})
		}
		statuses, err := f.rpc.ReceiptStatuses(ctx, txs)
		f.count(chain.MethodReceipt, len(txs))
		if err != nil {
			return nil, nil, err
		}
		for _, cand := range candidates[c[0]:c[1]] {
			if statuses[cand.tx.Hash] != 1 {
				continue // a reverted transaction moved no value
			}
			if e, ok := f.event(cand.user, asset, cand.block.Number, cand.tx.Hash, payment.TransferNative, cand.tx.To, cand.tx.Value); ok {
				out = append(out, e)
			}
		}
	}
	return out, blocks, nil
}

// event is the deposit the provider webhooks make for the same transfer
// (httpapi's intake): same id, same content (type, user, asset, amount,
// tx_hash, transfer_index, network; the content hash covers neither
// source nor trace id), so whichever arrives first wins and the other is
// a duplicate.
func (f finder) event(user int64, asset payment.Asset, block uint64, txHash, index, to string, value *big.Int) (postgres.NewEvent, bool) {
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
		Block:     block,
	}, true
}
