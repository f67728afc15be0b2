package chain

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/payment"
)

const (
	// RecipientsMax bounds the deposit addresses one deposit may name.
	RecipientsMax = 64
	// reasonAddressesMax bounds how many addresses a Mismatch reason lists.
	reasonAddressesMax = 5
)

// VerdictState is CheckDeposit's answer.
type VerdictState string

const (
	// Credit: the policy holds and the receipt is what the deposit claims.
	Credit VerdictState = "credit"
	// Wait: not decidable yet (no receipt, or the policy does not hold).
	Wait VerdictState = "wait"
	// Reverted: the transaction failed (receipt status 0).
	Reverted VerdictState = "reverted"
	// Mismatch: a token deposit whose receipt has no matching Transfer
	// log, a native deposit whose transaction pays someone else or
	// another amount, or an internal one whose trace frame does not.
	Mismatch VerdictState = "mismatch"
)

// Verdict is what the chain says about a deposit.
type Verdict struct {
	State VerdictState
	// BlockNumber and BlockHash locate the receipt when one was seen.
	BlockNumber uint64
	BlockHash   string
	// Finalized: the block is at or below the finalized block. A Credit
	// with Finalized false must be watched for reorgs until it is.
	Finalized bool
	// ReceiptSeen: a receipt exists (for Wait: mined, policy not met yet;
	// false: not mined, unknown, or dropped by a reorg).
	ReceiptSeen bool
	// Reason says why, in words fit for a log line or a DLQ row.
	Reason string
	// Head is the latest block number, read after a null receipt for a
	// Deposit with WantHead; 0 otherwise.
	Head uint64
	// Transfers are the indexes of the transfers that match the deposit
	// (Credit only), in log order: the ledger claims the first that no
	// other event holds.
	Transfers []string
	// FirstLogIndex is the receipt's (see Receipt): with it the ledger
	// recognises a transfer it holds under the log index of another block
	// the transaction was mined in before a reorg.
	FirstLogIndex uint64
}

// Deposit is what a webhook claims about a deposit with a transaction.
type Deposit struct {
	TxHash string
	// Token is the ERC-20 contract address; empty for native ETH.
	Token string
	// Recipients are the acceptable receiving addresses: the Transfer
	// log's `to` for a token (required), the transaction's `to` for
	// native value (checked when any are known).
	Recipients []string
	// Amount in base units, which the Transfer log or the transaction's
	// value must equal exactly.
	Amount *big.Int
	// Internal marks native value moved by a contract call inside the
	// transaction (a provider's "internal" transfer), which neither the
	// transaction nor its receipt shows: the transaction's call trace is
	// checked for it (see CheckerOptions.InternalStatusOnly).
	Internal bool
	// Index is the transfer the deposit names (a decimal log index,
	// "native", or "trace:<address>"); empty: any matching transfer.
	Index string
	// LogPosition is the position within the transaction of the log a
	// credited token deposit claimed (nil: unknown). Mined again in
	// another block, the transaction must still pay the deposit with the
	// log at that position: the ledger moves the claim there, so another
	// log paying it is another transfer, free to be claimed.
	LogPosition *int64
	// Owner, when Recipients is empty, says which of the addresses the
	// chain shows belong to the depositor: every registered address
	// counts, looked up by the addresses themselves.
	Owner AddressOwner
	// WantHead: with no receipt, read the latest head too (Verdict.Head),
	// for the rule that two absences must be a new block apart. Asked only
	// when it may decide something, to spare the node a read per check.
	WantHead bool
}

// AddressOwner tells which of some addresses are the depositor's.
type AddressOwner interface {
	Owned(ctx context.Context, addresses []string) ([]string, error)
}

// CanonicalState is what StillCanonical saw.
type CanonicalState string

const (
	// Final: the block is finalized and still has the same hash.
	Final CanonicalState = "final"
	// Canonical: in the chain at the same hash, not final yet.
	Canonical CanonicalState = "canonical"
	// Moved: the receipt is in another block, which the header at its
	// height confirms, and it still pays the deposit: the transaction was
	// mined again elsewhere.
	Moved CanonicalState = "moved"
	// Absent: no receipt, yet nothing else shows a reorg (the block at
	// the stored height still has the stored hash): a lagging index. Not
	// evidence on its own. A node with no block there, or a head below
	// it, answers ErrNodeBehind instead: no absence is recorded.
	Absent CanonicalState = "absent"
	// Gone: no receipt, and the block at the stored height has another
	// hash without the transaction; or mined again in a block whose
	// receipt no longer pays the deposit. Evidence that the deposit left
	// the chain.
	Gone CanonicalState = "gone"
)

// Canonicity is StillCanonical's answer.
type Canonicity struct {
	State CanonicalState
	// BlockNumber and BlockHash are where the transaction is now: the new
	// block when Moved, else the block asked about.
	BlockNumber uint64
	BlockHash   string
	// Final: the block above is finalized (Final, or Moved into a
	// finalized block).
	Final bool
	// Head is the latest block number the node reported; read only when
	// the receipt is missing (0 otherwise), for the rule that two
	// absences must be at least one new block apart.
	Head uint64
	// Reason says what the chain showed, fit for a log line.
	Reason string
}

// CheckerOptions configure NewChecker. Zero values take the defaults.
type CheckerOptions struct {
	// Redis holds the finality cache; nil disables it.
	Redis      redis.UniversalClient
	Registerer prometheus.Registerer
	FinalTTL   time.Duration
	// NotFinalTTL is how long "not final yet" is believed without asking
	// the chain again; negative disables the hint.
	NotFinalTTL time.Duration
	// RedisRetryAfter: after a Redis failure the cache is skipped this long.
	RedisRetryAfter time.Duration
	// Network namespaces the cache keys: a transaction hash names a
	// transaction on one chain only.
	Network string
	// InternalStatusOnly credits an internal transfer on its receipt's
	// status and finality alone, without its trace: the operator's
	// explicit choice for a node without the debug API.
	InternalStatusOnly bool
}

// Checker decides deposits against the chain.
type Checker struct {
	client             *Client
	cache              *finalityCache
	internalStatusOnly bool
}

// NewChecker builds a Checker on a Client.
func NewChecker(client *Client, opts CheckerOptions) *Checker {
	if opts.FinalTTL <= 0 {
		opts.FinalTTL = FinalTTLDefault
	}
	if opts.NotFinalTTL == 0 {
		opts.NotFinalTTL = NotFinalTTLDefault
	}
	if opts.RedisRetryAfter <= 0 {
		opts.RedisRetryAfter = BreakerRedisRetryAfterDefault
	}
	return &Checker{
		client:             client,
		internalStatusOnly: opts.InternalStatusOnly,
		cache: &finalityCache{
			rdb: opts.Redis, redis: &redisLatch{period: opts.RedisRetryAfter},
			finalTTL: opts.FinalTTL, notFinalTTL: opts.NotFinalTTL,
			metrics: newCacheMetrics(opts.Registerer), namespace: namespaceOf(opts.Network),
		},
	}
}

func namespaceOf(network string) string {
	if network == "" {
		return ""
	}
	return network + ":"
}

// Client is the checker's RPC client.
func (c *Checker) Client() *Client { return c.client }

// CheckDeposit decides a deposit under policy p. An error means the chain
// could not be asked (breaker open, timeout, refused connection: it is
// payment.ErrUnavailable, so wait and ask again) or the deposit itself is
// malformed (payment.ErrInvalid).
//
// Every terminal verdict (Credit, Reverted, Mismatch) waits for the
// policy: a receipt in a block that may still be reorged is not the
// chain's last word, whichever way it points.
func (c *Checker) CheckDeposit(ctx context.Context, d Deposit, p Policy) (Verdict, error) {
	d, err := d.normalized()
	if err != nil {
		return Verdict{}, err
	}
	if !p.Valid() {
		return Verdict{}, payment.Invalid("deposit finality policy is not set")
	}
	if r, ok := c.cache.final(ctx, d.TxHash); ok {
		// The cache answers without the node, so without the breaker,
		// which must still hold: while it is open nothing is credited.
		if err := c.client.BreakerOpen(ctx); err != nil {
			return Verdict{}, err
		}
		var latest uint64
		if p.Kind() == Confirmations {
			h, err := c.client.HeaderByTag(ctx, TagLatest)
			if err != nil {
				return Verdict{}, err
			}
			latest = h.Number
		}
		known := r.TxValue != nil
		d, err := c.resolveRecipients(ctx, d, r)
		if err != nil {
			return Verdict{}, err
		}
		v, err := c.checkValue(ctx, d, r, decide(d, p, r, true, latest))
		if err == nil && !known && r.TxValue != nil {
			c.cache.putFinal(ctx, r)
		}
		return v, err
	}
	if hint, ok := c.cache.notFinal(ctx, d.TxHash, p); ok {
		return Verdict{
			State: Wait, ReceiptSeen: true, BlockNumber: hint.BlockNumber, BlockHash: hint.BlockHash,
			Reason: fmt.Sprintf("mined in block %d; policy %s did not hold at the last check (rechecked at most every %s)", hint.BlockNumber, p, c.cache.notFinalTTL),
		}, nil
	}

	// The finalized (and latest) headers are read before the receipt:
	// a receipt read afterwards in a block at or below that finalized
	// height is in the finalized chain, with no window for a reorg in
	// between.
	finalized, haveFinalized, err := c.finalizedNumber(ctx)
	if err != nil {
		return Verdict{}, err
	}
	var latest uint64
	if p.Kind() == Confirmations {
		h, err := c.client.HeaderByTag(ctx, TagLatest)
		if err != nil {
			return Verdict{}, err
		}
		latest = h.Number
	}
	r, err := c.client.Receipt(ctx, d.TxHash)
	if errors.Is(err, ErrReceiptNotFound) {
		v := Verdict{State: Wait, Reason: "no receipt: not mined yet, unknown to the node, or dropped by a reorg"}
		if d.WantHead {
			// Read after the receipt, as absent reads it.
			h, err := c.client.HeaderByTag(ctx, TagLatest)
			if err != nil {
				return Verdict{}, err
			}
			v.Head = h.Number
		}
		return v, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	isFinal := haveFinalized && r.BlockNumber <= finalized
	if d, err = c.resolveRecipients(ctx, d, r); err != nil {
		return Verdict{}, err
	}
	v, err := c.checkValue(ctx, d, r, decide(d, p, r, isFinal, latest))
	if err != nil {
		return Verdict{}, err
	}
	if v.State == Wait {
		c.cache.putNotFinal(ctx, d.TxHash, p, notFinalRecord{BlockNumber: r.BlockNumber, BlockHash: r.BlockHash})
		return v, nil
	}
	// A terminal verdict (and a day in the cache) rests on this one
	// receipt: a height at or below finalized says nothing if the receipt
	// comes from a fork one backend has not dropped yet.
	stale, err := c.offChain(ctx, r)
	if err != nil {
		return Verdict{}, err
	}
	if stale != "" {
		return Verdict{State: Wait, Reason: stale + "; not evidence either way"}, nil
	}
	if isFinal {
		c.cache.putFinal(ctx, r)
	}
	return v, nil
}

// offChain compares a receipt's block with the header the chain has at its
// height: a receipt the headers do not show is one backend behind another.
// It says why when they differ, "" when they agree.
func (c *Checker) offChain(ctx context.Context, r *Receipt) (string, error) {
	h, err := c.client.HeaderByNumber(ctx, r.BlockNumber)
	if errors.Is(err, ErrBlockNotFound) {
		return "", payment.Unavailable("chain receipt block",
			fmt.Errorf("the node has a receipt in block %d but no block at that height", r.BlockNumber))
	}
	if err != nil {
		return "", err
	}
	if h.Hash != r.BlockHash {
		return fmt.Sprintf("the receipt names block %d %s, the chain has %s there", r.BlockNumber, r.BlockHash, h.Hash), nil
	}
	return "", nil
}

// checkValue holds a native deposit about to be credited against the
// transaction itself: the receipt shows a token's Transfer logs but not
// where a transaction's own value went, nor how much it was. The answer
// is kept in r, so a cached final receipt carries it. An internal
// deposit is held against its trace (checkTrace).
func (c *Checker) checkValue(ctx context.Context, d Deposit, r *Receipt, v Verdict) (Verdict, error) {
	if v.State != Credit || d.Token != "" {
		return v, nil
	}
	if d.Internal {
		return c.checkTrace(ctx, d, v)
	}
	if r.TxValue == nil {
		tx, err := c.client.Transaction(ctx, d.TxHash)
		if err != nil {
			return Verdict{}, err
		}
		r.TxTo, r.TxValue = tx.To, tx.Value
	}
	credit := v
	recipients := d.Recipients
	if len(recipients) == 0 && d.Owner != nil && r.TxTo != "" {
		owned, err := d.Owner.Owned(ctx, []string{r.TxTo})
		if err != nil {
			return Verdict{}, err
		}
		if len(owned) == 0 {
			v.State, v.Reason = Mismatch, fmt.Sprintf("the transaction pays %s, which is not a deposit address of the user", r.TxTo)
		}
		recipients = owned
	}
	switch {
	case v.State != Credit:
	case r.TxTo == "":
		v.State, v.Reason = Mismatch, "the transaction creates a contract; it pays no deposit address"
	case len(recipients) > 0 && !slices.Contains(recipients, r.TxTo):
		v.State, v.Reason = Mismatch, fmt.Sprintf("the transaction pays %s, not %s", r.TxTo, strings.Join(recipients, ", "))
	case r.TxValue.Cmp(d.Amount) != 0:
		v.State, v.Reason = Mismatch, fmt.Sprintf("the transaction carries %s base units, the deposit says %s", r.TxValue, d.Amount)
	}
	if v.State == Credit {
		return v, nil
	}
	v.Transfers = nil
	if d.Index == "" && !c.internalStatusOnly {
		return c.paidByACall(ctx, d, credit, v)
	}
	return v, nil
}

// paidByACall looks, for a native deposit (or payout) that names no
// transfer and that the transaction's own value does not pay, for ETH a
// call inside the transaction paid it: how a smart wallet (a Safe, an
// account contract) sends. Each such frame paying exactly the amount to a
// recipient (else an address of the owner) is a candidate, named as a
// provider names it (trace:<address>), for the ledger to claim the first
// no other event holds. Without the debug API the mismatch stands and
// says so.
func (c *Checker) paidByACall(ctx context.Context, d Deposit, credit, mismatch Verdict) (Verdict, error) {
	found, err := c.client.TxInternalTransfers(ctx, d.TxHash)
	if errors.Is(err, ErrTxTraceUnsupported) {
		mismatch.Reason += "; ETH paid by a call inside it was not looked for: the endpoint does not serve debug_traceTransaction"
		return mismatch, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	var paying []InternalTransfer
	var to []string
	for _, t := range found {
		if t.Value.Cmp(d.Amount) == 0 {
			paying = append(paying, t)
			if !slices.Contains(to, t.To) {
				to = append(to, t.To)
			}
		}
	}
	recipients := d.Recipients
	if len(recipients) == 0 && len(to) > 0 {
		recipients = to // no recipient named, and no owner: the value only
		if d.Owner != nil {
			if recipients, err = d.Owner.Owned(ctx, to); err != nil {
				return Verdict{}, err
			}
		}
	}
	credit.Transfers = nil
	for _, t := range paying {
		if slices.Contains(recipients, t.To) {
			credit.Transfers = append(credit.Transfers, t.Index())
		}
	}
	if len(credit.Transfers) == 0 {
		return mismatch, nil
	}
	credit.Reason += fmt.Sprintf("; paid by a call inside the transaction (%s)", strings.Join(credit.Transfers, ", "))
	return credit, nil
}

// checkTrace holds an internal deposit about to be credited against the
// transaction's call trace, numbered as the scanner numbers it: the frame
// its index names must be a CALL that neither failed nor lies under a
// frame that did, paying one of the recipients (else an address of the
// owner) exactly the amount. A provider's report is not the chain's word.
func (c *Checker) checkTrace(ctx context.Context, d Deposit, v Verdict) (Verdict, error) {
	if c.internalStatusOnly {
		return v, nil
	}
	address, _ := payment.TraceAddress(d.Index)
	mismatch := func(format string, args ...any) (Verdict, error) {
		v.State, v.Reason, v.Transfers = Mismatch, fmt.Sprintf(format, args...), nil
		return v, nil
	}
	typ, path, ok := parseTraceAddress(address)
	switch {
	case !ok:
		return mismatch("transfer %s names no call inside the transaction", d.Index)
	case typ != "CALL":
		return mismatch("transfer %s names a %s, which moves no ETH to its recipient", d.Index, typ)
	}
	call, found, err := c.client.TracedCallAt(ctx, d.TxHash, path)
	if err != nil {
		return Verdict{}, err
	}
	switch {
	case !found:
		return mismatch("the transaction's call trace has no frame %s", address)
	case call.Type != "CALL":
		return mismatch("frame %s of the transaction's call trace is a %s, not a CALL", address, call.Type)
	case call.Failed != "":
		return mismatch("the call at %s was rolled back (%s): it moved nothing", address, call.Failed)
	case call.To == "":
		return mismatch("the call at %s names no recipient", address)
	}
	recipients := d.Recipients
	if len(recipients) == 0 && d.Owner != nil {
		owned, err := d.Owner.Owned(ctx, []string{call.To})
		if err != nil {
			return Verdict{}, err
		}
		if len(owned) == 0 {
			return mismatch("the call at %s pays %s, which is not a deposit address of the user", address, call.To)
		}
		recipients = owned
	}
	switch {
	case len(recipients) > 0 && !slices.Contains(recipients, call.To):
		return mismatch("the call at %s pays %s, not %s", address, call.To, strings.Join(recipients, ", "))
	case call.Value.Cmp(d.Amount) != 0:
		return mismatch("the call at %s carries %s base units, the deposit says %s", address, call.Value, d.Amount)
	}
	return v, nil
}

// resolveRecipients fills a token deposit's recipients, when it names
// none, with the depositor's addresses among the receipt's Transfer logs
// of that token: one indexed lookup of those few addresses, however many
// the user has registered.
func (c *Checker) resolveRecipients(ctx context.Context, d Deposit, r *Receipt) (Deposit, error) {
	if d.Token == "" || len(d.Recipients) > 0 || d.Owner == nil {
		return d, nil
	}
	var candidates []string
	for _, t := range r.Transfers {
		if t.Contract == d.Token && !slices.Contains(candidates, t.To) {
			candidates = append(candidates, t.To)
		}
	}
	if len(candidates) == 0 {
		return d, nil
	}
	owned, err := d.Owner.Owned(ctx, candidates)
	if err != nil {
		return Deposit{}, err
	}
	d.Recipients = owned
	return d, nil
}

// StillCanonical tells the reorg watcher where a credited deposit's
// transaction is now: still in the block it was seen in (Final or
// Canonical), mined again in another block that still pays the deposit
// (Moved), missing without other evidence (Absent), or missing while the
// block at its height changed, or mined again without the deposit's
// transfer (Gone). An error means the chain could not be asked, or its
// answers contradict each other; ask again later.
func (c *Checker) StillCanonical(ctx context.Context, d Deposit, blockNumber uint64, blockHash string) (Canonicity, error) {
	d, err := d.normalized()
	if err != nil {
		return Canonicity{}, err
	}
	blockHash, err = parseHex(blockHash, hashHexLength, "block hash")
	if err != nil {
		return Canonicity{}, payment.Invalid("%w", err)
	}
	at := Canonicity{BlockNumber: blockNumber, BlockHash: blockHash}
	if r, ok := c.cache.final(ctx, d.TxHash); ok {
		// A final receipt never changes: if it is elsewhere, the block
		// asked about was reorged and the transaction finalized there.
		return c.located(ctx, d, r, at, true)
	}
	// Finalized first, for the same reason as in CheckDeposit.
	finalized, haveFinalized, err := c.finalizedNumber(ctx)
	if err != nil {
		return Canonicity{}, err
	}
	r, err := c.client.Receipt(ctx, d.TxHash)
	if errors.Is(err, ErrReceiptNotFound) {
		return c.missing(ctx, d.TxHash, at, func(r *Receipt) (Canonicity, error) {
			return c.locate(ctx, d, r, at, haveFinalized && r.BlockNumber <= finalized)
		})
	}
	if err != nil {
		return Canonicity{}, err
	}
	return c.locate(ctx, d, r, at, haveFinalized && r.BlockNumber <= finalized)
}

// locate answers for a receipt once the header at its height confirms its
// block: the receipt index could lag the chain on some nodes (or come from
// another backend than the headers), and that header is the chain's own
// word on what is canonical there.
func (c *Checker) locate(ctx context.Context, d Deposit, r *Receipt, at Canonicity, isFinal bool) (Canonicity, error) {
	stale, err := c.offChain(ctx, r)
	if err != nil {
		return Canonicity{}, err
	}
	if stale != "" {
		at.Reason = stale
		return c.absent(ctx, at)
	}
	v, err := c.located(ctx, d, r, at, isFinal)
	if err == nil && isFinal {
		c.cache.putFinal(ctx, r)
	}
	return v, err
}

// located answers for a receipt in a canonical block. In another block
// than the one asked about, the transaction ran again on another state (a
// contract deployed or funded in between may be missing), so it keeps the
// credit only if its new receipt still pays the deposit; else it is Gone.
func (c *Checker) located(ctx context.Context, d Deposit, r *Receipt, at Canonicity, isFinal bool) (Canonicity, error) {
	v := Canonicity{BlockNumber: r.BlockNumber, BlockHash: r.BlockHash, Final: isFinal}
	switch {
	case r.BlockNumber != at.BlockNumber || r.BlockHash != at.BlockHash:
		why, err := c.stillPays(ctx, d, r)
		if err != nil {
			return Canonicity{}, err
		}
		if why != "" {
			at.State, at.Reason = Gone, fmt.Sprintf("mined again in block %d %s without the deposit's transfer: %s", r.BlockNumber, r.BlockHash, why)
			return at, nil
		}
		v.State = Moved
		v.Reason = fmt.Sprintf("mined again in block %d %s (was block %d %s)", r.BlockNumber, r.BlockHash, at.BlockNumber, at.BlockHash)
	case isFinal:
		v.State, v.Reason = Final, fmt.Sprintf("block %d is finalized", r.BlockNumber)
	default:
		v.State, v.Reason = Canonical, fmt.Sprintf("block %d is canonical, not finalized yet", r.BlockNumber)
	}
	return v, nil
}

// stillPays checks a deposit against a receipt as a credit would, the
// policy aside: "" when it pays, else why not. A log index is block-wide,
// so the one claimed in the old block names nothing in the new one: a
// token deposit takes the log at its claim's position in the transaction
// (where the ledger moves the claim), or any Transfer log of the
// transaction that pays it when no position is known.
func (c *Checker) stillPays(ctx context.Context, d Deposit, r *Receipt) (string, error) {
	if d.Token != "" {
		d.Index = ""
		if d.LogPosition != nil && *d.LogPosition >= 0 {
			d.Index = payment.LogIndexTransfer(uint64(r.FirstLogIndex) + uint64(*d.LogPosition))
		}
	}
	d, err := c.resolveRecipients(ctx, d, r)
	if err != nil {
		return "", err
	}
	v, err := c.checkValue(ctx, d, r, decide(d, NonePolicy(), r, true, 0))
	switch {
	case err != nil:
		return "", err
	case v.State != Credit:
		return v.Reason, nil
	case d.Token != "" && d.Index != "" && v.Transfers[0] != d.Index:
		// Another log paying the same is another transfer, which some
		// other event may hold: only the claimed position keeps it.
		return fmt.Sprintf("its log at the claimed position (index %s) no longer pays the deposit", d.Index), nil
	}
	return "", nil
}

// missing decides a transaction without a receipt by the block at its
// stored height. The same hash is a lagging index (Absent); no block
// there, a lagging node (ErrNodeBehind). Another hash is a fork, yet one null receipt proves
// nothing: the receipt is read again, now that the headers show the fork,
// and found is answered by found. Gone needs that second null and the
// transaction missing from the block now at its height (the contract's
// "absent there too"); in that block, it is canonical there and only its
// receipt lags (Absent).
func (c *Checker) missing(ctx context.Context, txHash string, at Canonicity, found func(*Receipt) (Canonicity, error)) (Canonicity, error) {
	h, txs, err := c.client.BlockTxHashes(ctx, at.BlockNumber)
	switch {
	case errors.Is(err, ErrBlockNotFound):
		// The block was there when the transaction was seen: a node
		// without it lags, which is never evidence.
		return Canonicity{}, fmt.Errorf("%w: no receipt, and no block %d", ErrNodeBehind, at.BlockNumber)
	case err != nil:
		return Canonicity{}, err
	case h.Hash == at.BlockHash:
		at.Reason = fmt.Sprintf("no receipt; block %d still has hash %s", at.BlockNumber, at.BlockHash)
		return c.absent(ctx, at)
	}
	r, err := c.client.Receipt(ctx, txHash)
	switch {
	case err == nil:
		return found(r)
	case !errors.Is(err, ErrReceiptNotFound):
		return Canonicity{}, err
	case slices.Contains(txs, txHash):
		at.Reason = fmt.Sprintf("no receipt on two reads; block %d now has hash %s, which includes the transaction", at.BlockNumber, h.Hash)
		return c.absent(ctx, at)
	}
	at.State, at.Reason = Gone, fmt.Sprintf("no receipt; block %d now has hash %s, not %s, and neither it nor a second read has the transaction",
		at.BlockNumber, h.Hash, at.BlockHash)
	return at, nil
}

// absent completes an Absent answer with the head, read last, so that a
// second absence can be told at least one new block after the first. A
// head below the block is a lagging node (or backend), not an absence:
// its rising head would make two of its reads look a block apart.
func (c *Checker) absent(ctx context.Context, v Canonicity) (Canonicity, error) {
	head, err := c.client.HeaderByTag(ctx, TagLatest)
	if err != nil {
		return Canonicity{}, err
	}
	if head.Number < v.BlockNumber {
		return Canonicity{}, fmt.Errorf("%w: no receipt, and the head %d is below block %d", ErrNodeBehind, head.Number, v.BlockNumber)
	}
	v.State, v.Head = Absent, head.Number
	return v, nil
}

// finalizedNumber is the finalized block's height; have is false while
// the node has no finalized block.
func (c *Checker) finalizedNumber(ctx context.Context) (number uint64, have bool, err error) {
	h, err := c.client.HeaderByTag(ctx, TagFinalized)
	if errors.Is(err, ErrBlockNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return h.Number, true, nil
}

// decide applies the policy, then the receipt's status, then (for a
// token) the Transfer logs.
func decide(d Deposit, p Policy, r *Receipt, isFinal bool, latest uint64) Verdict {
	v := Verdict{BlockNumber: r.BlockNumber, BlockHash: r.BlockHash, Finalized: isFinal, ReceiptSeen: true, FirstLogIndex: uint64(r.FirstLogIndex)}
	holds, why := policyHolds(p, r.BlockNumber, isFinal, latest)
	if !holds {
		v.State, v.Reason = Wait, why
		if r.Status != 1 {
			v.Reason += "; the receipt says reverted, decided once the policy holds"
		}
		return v
	}
	if r.Status != 1 {
		v.State, v.Reason = Reverted, fmt.Sprintf("transaction reverted (receipt status %d) in block %d", r.Status, r.BlockNumber)
		return v
	}
	switch {
	case d.Token != "":
		matches, mismatch := matchTransfer(d, r.Transfers)
		if len(matches) == 0 {
			v.State, v.Reason = Mismatch, mismatch
			return v
		}
		v.Transfers = matches
	case d.Internal:
		v.Transfers = []string{d.Index}
	case d.Index != "" && d.Index != payment.TransferNative:
		v.State, v.Reason = Mismatch, fmt.Sprintf("transfer %s is not the transaction's own value, which is what a native deposit claims", d.Index)
		return v
	default:
		v.Transfers = []string{payment.TransferNative}
	}
	v.State, v.Reason = Credit, why
	return v
}

func policyHolds(p Policy, block uint64, isFinal bool, latest uint64) (bool, string) {
	switch p.Kind() {
	case Finalized:
		if isFinal {
			return true, fmt.Sprintf("block %d is finalized", block)
		}
		return false, fmt.Sprintf("block %d is not finalized yet", block)
	case Confirmations:
		var confirmations uint64
		if latest >= block {
			confirmations = latest - block + 1
		}
		if confirmations >= p.Confirmations() {
			return true, fmt.Sprintf("block %d has %d confirmations (policy %s)", block, confirmations, p)
		}
		return false, fmt.Sprintf("block %d has %d of %d confirmations", block, confirmations, p.Confirmations())
	}
	return true, fmt.Sprintf("mined in block %d (policy none)", block)
}

// matchTransfer finds the Transfer logs the deposit may claim: from the
// token contract, to one of the recipients, for exactly the amount. A
// named log index is the reporter's label in the block it saw the
// transaction in, and a fork that mines the transaction again elsewhere
// shifts it onto another log of the transaction, or past its last: so
// the named log comes first when it pays, and every other log that pays
// exactly the same follows. Such logs are interchangeable for the
// deposit, and the ledger's claims (followed to the block the chain
// shows) credit each of them at most once. The reason names the first
// condition nothing satisfied.
func matchTransfer(d Deposit, transfers []Transfer) ([]string, string) {
	if len(transfers) == 0 {
		return nil, "the receipt has no ERC-20 Transfer log"
	}
	if d.Index == "" {
		return payingLogs(d, transfers, 0, false)
	}
	named, ok := payment.LogIndex(d.Index)
	if !ok {
		return nil, fmt.Sprintf("transfer %s is not a log index, which is what a token deposit claims", d.Index)
	}
	matches, reason := payingLogs(d, transfers, named, true)
	if len(matches) == 0 {
		reason += fmt.Sprintf(" (the deposit names log %d; any log of the transaction paying it would do)", named)
	}
	return matches, reason
}

// payingLogs is matchTransfer's search, the named log (when naming) first.
func payingLogs(d Deposit, transfers []Transfer, named uint64, naming bool) ([]string, string) {
	var fromToken []Transfer
	for _, t := range transfers {
		if t.Contract == d.Token {
			fromToken = append(fromToken, t)
		}
	}
	if len(fromToken) == 0 {
		return nil, fmt.Sprintf("no Transfer log from token contract %s (the receipt's Transfer logs come from %s)",
			d.Token, listAddresses(transfers, func(t Transfer) string { return t.Contract }))
	}
	var toRecipient []Transfer
	for _, t := range fromToken {
		if slices.Contains(d.Recipients, t.To) {
			toRecipient = append(toRecipient, t)
		}
	}
	if len(toRecipient) == 0 {
		return nil, fmt.Sprintf("no Transfer log of %s to %s (its Transfer logs go to %s)",
			d.Token, strings.Join(d.Recipients, ", "), listAddresses(fromToken, func(t Transfer) string { return t.To }))
	}
	var matches []string
	for _, t := range toRecipient {
		if t.Value.Cmp(d.Amount) != 0 {
			continue
		}
		index := payment.LogIndexTransfer(uint64(t.LogIndex))
		if naming && uint64(t.LogIndex) == named {
			matches = append([]string{index}, matches...)
			continue
		}
		matches = append(matches, index)
	}
	if len(matches) > 0 {
		return matches, ""
	}
	values := make([]string, 0, min(len(toRecipient), reasonAddressesMax))
	for i, t := range toRecipient {
		if i == reasonAddressesMax {
			values = append(values, fmt.Sprintf("and %d more", len(toRecipient)-i))
			break
		}
		values = append(values, t.Value.String())
	}
	return nil, fmt.Sprintf("Transfer log of %s to %s carries %s base units, the deposit says %s",
		d.Token, toRecipient[0].To, strings.Join(values, ", "), d.Amount)
}

// listAddresses names the distinct addresses pick returns, at most
// reasonAddressesMax of them.
func listAddresses(transfers []Transfer, pick func(Transfer) string) string {
	var seen []string
	for _, t := range transfers {
		if a := pick(t); !slices.Contains(seen, a) {
			seen = append(seen, a)
		}
	}
	if len(seen) > reasonAddressesMax {
		return strings.Join(seen[:reasonAddressesMax], ", ") + fmt.Sprintf(" and %d more", len(seen)-reasonAddressesMax)
	}
	return strings.Join(seen, ", ")
}

// normalized validates a deposit and lowercases its hex.
func (d Deposit) normalized() (Deposit, error) {
	out := Deposit{Amount: d.Amount, Internal: d.Internal, Index: d.Index, Owner: d.Owner, LogPosition: d.LogPosition, WantHead: d.WantHead}
	var err error
	if out.TxHash, err = ParseTxHash(d.TxHash); err != nil {
		return Deposit{}, err
	}
	if len(d.Recipients) > RecipientsMax {
		return Deposit{}, payment.Invalid("deposit names %d recipients, at most %d", len(d.Recipients), RecipientsMax)
	}
	for _, r := range d.Recipients {
		a, err := ParseAddress(r)
		if err != nil {
			return Deposit{}, err
		}
		out.Recipients = append(out.Recipients, a)
	}
	kind := "native"
	switch {
	case d.Token != "":
		kind = "token"
		if out.Token, err = ParseAddress(d.Token); err != nil {
			return Deposit{}, err
		}
		if len(out.Recipients) == 0 && out.Owner == nil {
			return Deposit{}, payment.Invalid("token deposit without a recipient address")
		}
	case d.Internal:
		kind = "internal"
		if !payment.InternalTransfer(d.Index) {
			return Deposit{}, payment.Invalid("internal transfer without its trace address")
		}
		// The claim is the index in its one spelling, whatever a row
		// stored before it says.
		if out.Index, err = payment.ParseTransferIndex(d.Index); err != nil {
			return Deposit{}, err
		}
	}
	if d.Amount == nil || d.Amount.Sign() <= 0 {
		return Deposit{}, payment.Invalid("%s deposit without a positive amount", kind)
	}
	return out, nil
}
