package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// Ledger timeouts of the seed: a batch waits at most this long for a row
// lock, and no statement runs longer. Both end in a retryable error.
const (
	LedgerLockTimeoutDefault      = 2 * time.Second
	LedgerStatementTimeoutDefault = 5 * time.Second
	// LedgerBatchMax bounds one transaction; callers split larger sets.
	LedgerBatchMax = 500
	// rollbackTimeout bounds the ROLLBACK after a failed batch, which runs
	// even when the caller's context is gone.
	rollbackTimeout = 2 * time.Second
)

// LedgerOptions tune ApplyBatch.
type LedgerOptions struct {
	LockTimeout      time.Duration
	StatementTimeout time.Duration
	// Notify writes user notifications into notification_outbox in the
	// same transaction (only when someone delivers them).
	Notify bool
}

func (o LedgerOptions) withDefaults() LedgerOptions {
	if o.LockTimeout <= 0 {
		o.LockTimeout = LedgerLockTimeoutDefault
	}
	if o.StatementTimeout <= 0 {
		o.StatementTimeout = LedgerStatementTimeoutDefault
	}
	return o
}

// ChainEvidence is what the chain said about a credited deposit.
type ChainEvidence struct {
	BlockNumber int64
	BlockHash   string
	// Watch: credited before finality; the reorg watcher follows it until
	// its block is finalized. False with a block means already final.
	Watch bool
	// Transfers are the indexes of the transfers in the transaction that
	// match the deposit, in log order; the ledger claims the first that no
	// other event holds.
	Transfers []string
	// FirstLogIndex is the block-wide index of the transaction's first
	// log in BlockHash: claims made while the transaction sat in another
	// block are recognised by their position in the transaction.
	FirstLogIndex int64
}

// LedgerItem asks for one event to be applied. Event comes from the task:
// its id and generation select the row; its other fields must match the
// row, and the row's values are the ones that move money.
type LedgerItem struct {
	Event payment.Event
	Chain *ChainEvidence
}

// LedgerResultKind says what a batch did for an item.
type LedgerResultKind int

const (
	// Applied: this transaction made the event terminal with Outcome.
	Applied LedgerResultKind = iota + 1
	// AlreadyDone: the event was terminal before (a redelivery).
	AlreadyDone
	// Stale: the task belongs to an older generation, or the event is not
	// in a state this task may touch; nothing to do.
	Stale
	// Rejected: the task cannot be applied (unknown event, payload that
	// does not match the event); Err says why. The event is untouched.
	Rejected
	// Retry: this item could not be settled in this transaction; run it
	// again later. Err says why.
	Retry
)

func (k LedgerResultKind) String() string {
	switch k {
	case Applied:
		return "applied"
	case AlreadyDone:
		return "already_done"
	case Stale:
		return "stale"
	case Rejected:
		return "rejected"
	case Retry:
		return "retry"
	}
	return "unknown"
}

// LedgerResult is the fate of one item.
type LedgerResult struct {
	Kind    LedgerResultKind
	Status  payment.Status
	Outcome payment.Outcome
	// Err explains Rejected, Retry and a dead_lettered outcome.
	Err error
	// DeadLetterID is set when the ledger wrote a DLQ row for the item.
	DeadLetterID int64
	// Alert is set when a human should hear of this outcome right away
	// (a reorg compensation the balance cannot cover, a broken invariant).
	Alert string
	// CreatedAt is when the event was accepted, for latency metrics.
	CreatedAt time.Time
	// Event holds the authoritative values when the event was claimed.
	Event payment.Event
}

// claimedEvent is a row the ledger claimed, with the values that count.
type claimedEvent struct {
	event     payment.Event
	related   string
	createdAt time.Time
	key       string
	item      int // index into the deduplicated items
	// network and native describe the event's asset: where its transfer
	// lives, and whether it is the network's own coin.
	network string
	native  bool
	// holdID is the hold a post or void resolves; holdNetwork and
	// toAddress say where a hold pays out.
	holdID      string
	holdNetwork string
	toAddress   string
}

// ApplyBatch applies events in one transaction: lock the balances rows in
// order, lock the events, read their idempotency records, move money,
// write the journal, the records and the notifications, and move each
// event from enqueued to its terminal status, then commit. A returned
// error means nothing was committed and every item may be retried; per-item
// fates are in the results otherwise.
func (db *DB) ApplyBatch(ctx context.Context, items []LedgerItem, opts LedgerOptions) ([]LedgerResult, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > LedgerBatchMax {
		return nil, fmt.Errorf("ledger batch of %d exceeds %d", len(items), LedgerBatchMax)
	}
	opts = opts.withDefaults()

	// Identical tasks (same event, same generation) share one fate.
	unique, alias := dedupeItems(items)
	excluded := map[int]error{}
	for attempt := 0; ; attempt++ {
		results, retryItems, err := db.applyOnce(ctx, unique, excluded, opts)
		if err != nil {
			return nil, err
		}
		if len(retryItems) == 0 {
			out := make([]LedgerResult, len(items))
			for i := range items {
				out[i] = results[alias[i]]
			}
			return out, nil
		}
		// Items that cannot settle in this transaction are locked but not
		// moved; roll back and run the rest without them.
		for idx, why := range retryItems {
			excluded[idx] = why
		}
		if attempt+1 >= ledgerRoundsMax {
			return retryEverything(len(unique), alias, excluded), nil
		}
	}
}

// ledgerRoundsMax bounds the transactions one ApplyBatch runs when items
// keep asking to wait (a post whose hold has not settled): past it nothing
// was committed, and every item is handed back to be retried.
const ledgerRoundsMax = 3

// retryEverything is the fate of a batch that ran out of rounds: the
// items that asked to wait keep their reason, the others are retried
// because the batch rolled back.
func retryEverything(unique int, alias []int, excluded map[int]error) []LedgerResult {
	rolledBack := payment.Retryable("ledger", fmt.Errorf("batch rolled back after %d rounds of items waiting", ledgerRoundsMax))
	results := make([]LedgerResult, unique)
	for i := range results {
		why, ok := excluded[i]
		if !ok {
			why = rolledBack
		}
		results[i] = LedgerResult{Kind: Retry, Err: why}
	}
	out := make([]LedgerResult, len(alias))
	for i, a := range alias {
		out[i] = results[a]
	}
	return out
}

func dedupeItems(items []LedgerItem) ([]LedgerItem, []int) {
	type identity struct {
		id         string
		generation int
	}
	first := map[identity]int{}
	var unique []LedgerItem
	alias := make([]int, len(items))
	for i, item := range items {
		id := identity{item.Event.ID, item.Event.Generation}
		if j, ok := first[id]; ok {
			alias[i] = j
			continue
		}
		first[id] = len(unique)
		alias[i] = len(unique)
		unique = append(unique, item)
	}
	return unique, alias
}

// applyOnce runs one transaction over items minus excluded. retryItems
// names items that forced a rollback and must be excluded next time.
func (db *DB) applyOnce(ctx context.Context, items []LedgerItem, excluded map[int]error, opts LedgerOptions) (results []LedgerResult, retryItems map[int]error, err error) {
	results = make([]LedgerResult, len(items))
	var live []int
	for i := range items {
		if why, ok := excluded[i]; ok {
			results[i] = LedgerResult{Kind: Retry, Err: why}
			continue
		}
		live = append(live, i)
	}
	if len(live) == 0 {
		return results, nil, nil
	}

	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, classify("ledger acquire", err)
	}
	defer conn.Release()
	committed := false
	defer func() {
		if !committed {
			rollback(conn)
		}
	}()

	// Round trip 1, pipelined: begin, timeouts, lazy balance rows (only
	// for pairs this process has not seen yet), the balance row locks in
	// order, the event locks, and the idempotency records already written.
	pairs := balancePairs(items, live)
	users, assets := make([]int64, len(pairs)), make([]string, len(pairs))
	var newUsers []int64
	var newAssets []string
	for i, p := range pairs {
		users[i], assets[i] = p.user, p.asset
		if _, known := db.knownBalances.Load(p); !known {
			newUsers, newAssets = append(newUsers, p.user), append(newAssets, p.asset)
		}
	}
	claim := newClaim(items, live)
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(q("ledger_settings").text, durationSetting(opts.LockTimeout), durationSetting(opts.StatementTimeout))
	batch.Queue(q("hot_path_plans").text)
	if len(newUsers) > 0 {
		batch.Queue(q("ledger_ensure_balances").text, newUsers, newAssets)
	}
	batch.Queue(q("ledger_lock_balances").text, users, assets)
	claim.queue(batch)
	balances := map[balanceKey]decimal.Decimal{}
	held := map[balanceKey]decimal.Decimal{}
	var replays map[string]payment.Outcome
	if err := readBatch(ctx, conn, batch, func(br pgx.BatchResults) error {
		execs := 3 // BEGIN, ledger_settings, hot_path_plans
		if len(newUsers) > 0 {
			execs++
		}
		for range execs {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var k balanceKey
			var text, heldText string
			if err := rows.Scan(&k.user, &k.asset, &text, &heldText); err != nil {
				rows.Close()
				return err
			}
			balances[k] = decimal.RequireFromString(text)
			held[k] = decimal.RequireFromString(heldText)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if err := claim.read(br); err != nil {
			return err
		}
		if len(claim.keys) == 0 {
			replays = map[string]payment.Outcome{}
			return nil
		}
		replays, err = readOutcomes(br)
		return err
	}); err != nil {
		return nil, nil, classify("ledger lock", err)
	}

	// A remembered pair without its row cannot happen while rows are never
	// deleted; should it anyway, forget it and let the batch run again
	// rather than fail an event as if its user were unknown.
	for _, p := range pairs {
		if _, ok := balances[p]; !ok {
			if _, remembered := db.knownBalances.Load(p); remembered {
				db.knownBalances.Delete(p)
				return nil, nil, payment.Retryable("ledger lock", fmt.Errorf("balance row of user %d in %s vanished", p.user, p.asset))
			}
		}
	}

	// Events not locked: read where they stand (rare: redeliveries, stale
	// generations).
	claimed, err := claim.settle(ctx, conn, items, live, results)
	if err != nil {
		return nil, nil, err
	}
	if len(claimed) == 0 {
		committed = true
		return results, nil, commit(ctx, conn)
	}

	chain := map[int]*ChainEvidence{}
	for _, c := range claimed {
		chain[c.item] = items[c.item].Chain
	}
	plan := planBatch(claimed, chain, replays, balances, claim.claims, &holdBook{held: held, holds: claim.holds, events: claim.holdEvents})
	if len(plan.retry) > 0 {
		return nil, plan.retry, nil
	}
	for idx, r := range plan.results {
		results[idx] = r
	}

	// Round trip 4: every write, then COMMIT, pipelined. Anything
	// unexpected (a journal row that already exists, a balance that would
	// go negative) raises an error that aborts the transaction, so the
	// queued COMMIT becomes a rollback.
	batch = &pgx.Batch{}
	plan.queueWrites(batch, opts.Notify)
	batch.Queue("COMMIT")
	var dlqIDs []int64
	err = readBatch(ctx, conn, batch, func(br pgx.BatchResults) error {
		for _, kind := range plan.writeKinds {
			if kind == writeDLQ {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				for rows.Next() {
					var id int64
					if err := rows.Scan(&id); err != nil {
						rows.Close()
						return err
					}
					dlqIDs = append(dlqIDs, id)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return err
				}
				continue
			}
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		tag, err := br.Exec()
		if err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("transaction ended with %s", tag)
		}
		return err
	})
	if err != nil {
		return nil, nil, classify("ledger write", err)
	}
	committed = true
	// Remember the rows only now: before the commit they may be another
	// transaction's uncommitted inserts, or this one's rolled back.
	for k := range balances {
		db.knownBalances.Store(k, struct{}{})
	}
	for i, idx := range plan.dlqItems {
		if i < len(dlqIDs) {
			results[idx].DeadLetterID = dlqIDs[i]
		}
	}
	return results, nil, nil
}

type balanceKey struct {
	user  int64
	asset string
}

func balancePairs(items []LedgerItem, live []int) []balanceKey {
	seen := map[balanceKey]bool{}
	var pairs []balanceKey
	for _, i := range live {
		k := balanceKey{items[i].Event.UserID, items[i].Event.Asset}
		if !seen[k] {
			seen[k] = true
			pairs = append(pairs, k)
		}
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].user != pairs[j].user {
			return pairs[i].user < pairs[j].user
		}
		return pairs[i].asset < pairs[j].asset
	})
	return pairs
}

// claim gathers the events a batch locks: it queues the lock and the
// read of their idempotency records into the first pipeline, then sorts
// out the tasks whose events it could not lock.
type claim struct {
	ids, types, assets, amounts, keys, txs []string
	generations                            []int32
	users                                  []int64
	itemOf                                 map[identity]int
	claimed                                []claimedEvent
	locked                                 map[string]bool
	// txHashes of the deposits that claim a transfer, and the claims
	// already held on those transactions.
	txHashes []string
	claims   map[txKey][]transferClaim
	// resolving are the ids of posts and voids; holds and holdEvents what
	// the batch read of the holds they name.
	resolving  []string
	holds      map[string]*holdRow
	holdEvents map[string]payment.Status
}

type identity struct {
	id         string
	generation int
}

func newClaim(items []LedgerItem, live []int) *claim {
	n := len(live)
	c := &claim{
		ids: make([]string, n), types: make([]string, n), assets: make([]string, n), amounts: make([]string, n), txs: make([]string, n),
		generations: make([]int32, n), users: make([]int64, n),
		itemOf: map[identity]int{}, locked: map[string]bool{},
	}
	for k, i := range live {
		e := items[i].Event
		c.ids[k], c.types[k], c.assets[k], c.amounts[k], c.txs[k] = e.ID, string(e.Type), e.Asset, e.Amount.String(), e.TxHash
		c.generations[k], c.users[k] = int32(e.Generation), e.UserID
		// Only an event handed to the queue afresh (generation > 0) can have
		// an idempotency record already: the record is written in the same
		// transaction that makes an event terminal, and only a DLQ replay
		// takes a terminal event back. Looking up the others would probe
		// every daily partition of processed_events for nothing. (The key
		// comes from the task's type: a task whose type is not the row's
		// locks nothing, so a wrong key is never used.)
		if e.Generation > 0 {
			c.keys = append(c.keys, payment.IdempotencyKey(e.ID, e.Type))
		}
		c.itemOf[identity{e.ID, e.Generation}] = i
		if e.TxHash != "" && e.Type.Credit() && !slices.Contains(c.txHashes, e.TxHash) {
			c.txHashes = append(c.txHashes, e.TxHash)
		}
		if e.Type.ResolvesHold() {
			c.resolving = append(c.resolving, e.ID)
		}
	}
	return c
}

func (c *claim) queue(batch *pgx.Batch) {
	batch.Queue(q("ledger_claim").text, c.ids, c.generations, c.types, c.users, c.assets, c.amounts, c.txs)
	if len(c.txHashes) > 0 {
		batch.Queue(q("ledger_lock_transfers").text, c.txHashes)
		batch.Queue(q("ledger_transfer_claims").text, c.txHashes)
	}
	if len(c.resolving) > 0 {
		batch.Queue(q("ledger_hold_events").text, c.resolving)
		batch.Queue(q("ledger_lock_holds").text, c.resolving)
	}
	if len(c.keys) > 0 {
		batch.Queue(q("ledger_key_outcomes").text, c.keys)
	}
}

func (c *claim) read(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var e claimedEvent
		var eventType, amount string
		var generation int32
		if err := rows.Scan(&e.event.ID, &generation, &eventType, &e.event.UserID, &e.event.Asset, &amount,
			&e.event.TraceID, &e.related, &e.createdAt, &e.event.TxHash, &e.event.TransferIndex, &e.network, &e.native,
			&e.holdID, &e.holdNetwork, &e.toAddress); err != nil {
			return err
		}
		e.event.Type = payment.EventType(eventType)
		e.event.Amount = decimal.RequireFromString(amount)
		e.event.Generation = int(generation)
		e.event.HoldID, e.event.ToAddress = e.holdID, e.toAddress
		if e.event.Type == payment.WithdrawalHold {
			e.event.Network = e.holdNetwork
		}
		e.item = c.itemOf[identity{e.event.ID, e.event.Generation}]
		e.key = payment.IdempotencyKey(e.event.ID, e.event.Type)
		c.claimed = append(c.claimed, e)
		c.locked[e.event.ID] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	if len(c.txHashes) > 0 {
		if _, err := br.Exec(); err != nil { // ledger_lock_transfers
			return err
		}
		if c.claims, err = readTransferClaims(br); err != nil {
			return err
		}
	}
	if len(c.resolving) > 0 {
		if c.holdEvents, err = readHoldEvents(br); err != nil {
			return err
		}
		c.holds, err = readHolds(br)
	}
	return err
}

// txKey names a transaction on a network.
type txKey struct {
	network string
	txHash  string
}

// transferClaim is a chain_transfers row.
type transferClaim struct {
	index   string
	asset   string
	eventID string
	// blockHash and position (-1: not a log) say where the claimed log
	// was when it was claimed.
	blockHash string
	position  int64
}

func readTransferClaims(br pgx.BatchResults) (map[txKey][]transferClaim, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	claims := map[txKey][]transferClaim{}
	for rows.Next() {
		var k txKey
		var t transferClaim
		if err := rows.Scan(&k.network, &k.txHash, &t.index, &t.asset, &t.eventID, &t.blockHash, &t.position); err != nil {
			return nil, err
		}
		claims[k] = append(claims[k], t)
	}
	return claims, rows.Err()
}

func readOutcomes(br pgx.BatchResults) (map[string]payment.Outcome, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]payment.Outcome{}
	for rows.Next() {
		var k, outcome string
		if err := rows.Scan(&k, &outcome); err != nil {
			return nil, err
		}
		out[k] = payment.Outcome(outcome)
	}
	return out, rows.Err()
}

// settle returns the locked events and classifies every task whose event
// was not locked, from the event's actual state.
func (c *claim) settle(ctx context.Context, conn *pgxpool.Conn, items []LedgerItem, live []int, results []LedgerResult) ([]claimedEvent, error) {
	var missing []string
	for _, id := range c.ids {
		if !c.locked[id] {
			missing = append(missing, id)
		}
	}
	refused := map[string]Refusal{}
	if len(missing) > 0 {
		var err error
		if refused, err = eventStates(ctx, conn, missing); err != nil {
			return nil, err
		}
	}
	claimedItem := map[int]bool{}
	for _, e := range c.claimed {
		claimedItem[e.item] = true
	}
	for _, i := range live {
		if claimedItem[i] {
			continue
		}
		task := items[i].Event
		r := refused[task.ID]
		switch {
		case c.locked[task.ID]:
			// Another generation's task holds the event in this batch.
			results[i] = LedgerResult{Kind: Stale, Status: payment.StatusEnqueued}
		case !r.Found:
			results[i] = LedgerResult{Kind: Rejected, Err: fmt.Errorf("event %s: %w", task.ID, payment.ErrNotFound)}
		case r.Status.Terminal():
			results[i] = LedgerResult{Kind: AlreadyDone, Status: r.Status}
		case r.Status == payment.StatusEnqueued && r.Generation == task.Generation:
			// The live task of an enqueued event that it could not lock:
			// its payload does not describe the stored event.
			results[i] = LedgerResult{Kind: Rejected, Status: r.Status,
				Err: payment.Invalid("task payload for event %s does not match the stored event", task.ID)}
		default:
			results[i] = LedgerResult{Kind: Stale, Status: r.Status}
		}
	}
	return c.claimed, nil
}

// Notification kinds written to notification_outbox.
const (
	NotifyDepositCredited     = "deposit_credited"
	NotifyWithdrawalConfirmed = "withdrawal_confirmed"
	NotifyInsufficientFunds   = "insufficient_funds"
	NotifyDepositReversed     = "deposit_reversed"
)

type writeKind int

const (
	writeBalances writeKind = iota
	writeJournal
	writeMovedTransfers
	writeTransfers
	writeOutcomes
	writeKeyUpdates
	writeConfirm
	writeFail
	writeDLQ
	writeNotifications
	writeOpenHolds
	writeResolveHolds
)

// batchPlan is everything one transaction will write, decided in Go from
// the locked balances before a single write is sent.
type batchPlan struct {
	results map[int]LedgerResult
	retry   map[int]error

	deltas  map[balanceKey]decimal.Decimal
	journal []journalRow
	// claims on each transaction, held before and planned here; newClaims
	// are the rows to write.
	claims    map[txKey][]transferClaim
	newClaims []plannedClaim
	// movedClaims are held claims whose transaction is now mined in
	// another block, with the log index their transfer has there.
	movedClaims []plannedClaim
	// outcomes to record, by idempotency key, with their event ids;
	// reopened keys exist already (a dead-lettered attempt) and are updated
	outcomes     map[string]payment.Outcome
	keyEvents    map[string]string
	reopened     map[string]bool
	confirms     []confirmRow
	fails        []failRow
	deadLetters  []payment.DeadLetter
	dlqItems     []int
	notification []notificationRow

	// balances are the running balances of the locked rows; book, the
	// holds the batch knows, heldDeltas the changes of balances.held, and
	// newHolds and resolutions the holds rows to write.
	balances    map[balanceKey]decimal.Decimal
	book        *holdBook
	heldDeltas  map[balanceKey]decimal.Decimal
	newHolds    []holdRow
	resolutions []holdResolution

	writeKinds []writeKind
}

type plannedClaim struct {
	tx    txKey
	claim transferClaim
}

type journalRow struct {
	user      int64
	asset     string
	amount    decimal.Decimal
	eventType payment.EventType
	source    string
	network   string
}

type confirmRow struct {
	id      string
	chain   *ChainEvidence
	outcome payment.Outcome
	// unwatched: the chain evidence is recorded, but nobody watches it
	// for reorgs (a post's payment out, not a deposit).
	unwatched bool
}

type failRow struct {
	id      string
	outcome payment.Outcome
	err     string
}

type notificationRow struct {
	deliveryID string
	eventID    string
	user       int64
	kind       string
	payload    string
	traceID    string
}

// planBatch decides each claimed event's fate against the running
// balances, in (user, asset, accepted-at) order so that a user's
// withdrawals are served first come, first served.
func planBatch(claimed []claimedEvent, chain map[int]*ChainEvidence, replays map[string]payment.Outcome, balances map[balanceKey]decimal.Decimal, claims map[txKey][]transferClaim, book *holdBook) *batchPlan {
	if claims == nil {
		claims = map[txKey][]transferClaim{}
	}
	p := &batchPlan{
		balances:   balances,
		book:       book.withDefaults(),
		heldDeltas: map[balanceKey]decimal.Decimal{},
		claims:     claims,
		results:    map[int]LedgerResult{},
		retry:      map[int]error{},
		deltas:     map[balanceKey]decimal.Decimal{},
		outcomes:   map[string]payment.Outcome{},
		keyEvents:  map[string]string{},
		reopened:   map[string]bool{},
	}
	for _, c := range claimed {
		p.keyEvents[c.key] = c.event.ID
	}
	sort.SliceStable(claimed, func(i, j int) bool {
		a, b := claimed[i], claimed[j]
		if a.event.UserID != b.event.UserID {
			return a.event.UserID < b.event.UserID
		}
		if a.event.Asset != b.event.Asset {
			return a.event.Asset < b.event.Asset
		}
		if !a.createdAt.Equal(b.createdAt) {
			return a.createdAt.Before(b.createdAt)
		}
		return a.event.ID < b.event.ID
	})
	for _, c := range claimed {
		result := LedgerResult{Kind: Applied, CreatedAt: c.createdAt, Event: c.event}
		prior, seen := replays[c.key]
		if seen && prior.Reopenable() {
			p.reopened[c.key] = true
		}
		if seen && !prior.Reopenable() {
			// Replay path: the key was written before; bring the event to
			// the status its recorded outcome implies, without moving money.
			switch {
			case prior.Confirms():
				p.confirms = append(p.confirms, confirmRow{id: c.event.ID, outcome: prior})
				result.Status, result.Outcome = payment.StatusConfirmed, prior
			case prior == payment.OutcomePending:
				// A pending key that committed belongs to no live
				// transaction; retry later and let the zombie check report it.
				p.retry[c.item] = payment.Retryable("ledger replay", fmt.Errorf("idempotency key of %s is still pending", c.event.ID))
				continue
			default:
				p.fails = append(p.fails, failRow{id: c.event.ID, outcome: prior})
				result.Status, result.Outcome = payment.StatusFailed, prior
			}
			p.results[c.item] = result
			continue
		}
		if !p.apply(c, chain[c.item], balances, &result) {
			continue
		}
		p.results[c.item] = result
	}
	p.order()
	return p
}

// apply moves money for a first-time event (or one whose last attempt was
// dead-lettered and a human replayed it). It reports false when the item
// must wait for another transaction (its result says why).
func (p *batchPlan) apply(c claimedEvent, chain *ChainEvidence, balances map[balanceKey]decimal.Decimal, result *LedgerResult) bool {
	e := c.event
	k := balanceKey{e.UserID, e.Asset}
	balance, exists := balances[k]
	switch {
	case !exists:
		p.deadLetter(c, result, fmt.Sprintf("user %d or asset %s is unknown", e.UserID, e.Asset), "")
	case e.Type == payment.WithdrawalHold:
		p.reserve(c, k, balance, result)
	case e.Type.ResolvesHold():
		return p.resolve(c, k, balance, chain, result)
	default:
		p.move(c, k, balance, chain, balances, result)
	}
	return true
}

// move credits or debits the balance; a debit takes only from available.
func (p *batchPlan) move(c claimedEvent, k balanceKey, balance decimal.Decimal, chain *ChainEvidence, balances map[balanceKey]decimal.Decimal, result *LedgerResult) {
	e := c.event
	if e.Type.Credit() {
		next := balance.Add(e.Amount)
		if !money.FitsBalance(next) {
			p.deadLetter(c, result, fmt.Sprintf("crediting %s %s would take the balance of user %d past 10^20", e.Amount, e.Asset, e.UserID), "")
			return
		}
		if e.TxHash != "" && !p.claimTransfer(c, chain) {
			// Another event holds every transfer this deposit could be: the
			// money arrived once and was credited once.
			p.outcomes[c.key] = payment.OutcomeDuplicateTransfer
			p.fails = append(p.fails, failRow{id: e.ID, outcome: payment.OutcomeDuplicateTransfer,
				err: fmt.Sprintf("transfer of %s already credited to another event", e.TxHash)})
			result.Status, result.Outcome = payment.StatusFailed, payment.OutcomeDuplicateTransfer
			return
		}
		p.post(c, e.Amount, next, balances)
		p.confirms = append(p.confirms, confirmRow{id: e.ID, chain: chain, outcome: payment.OutcomeSuccess})
		p.notify(c, NotifyDepositCredited, next)
		result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
		return
	}
	if held := p.book.held[k]; !canDebit(balance, held, e.Amount) {
		if e.Type == payment.ReorgCompensation {
			reason := fmt.Sprintf("reorg compensation of %s %s exceeds the available balance of user %d (%s, of which %s held): settle by hand",
				e.Amount, e.Asset, e.UserID, balance, held)
			p.deadLetter(c, result, reason, reason)
			return
		}
		p.refuse(c, result, payment.OutcomeInsufficientFunds, "")
		p.notify(c, NotifyInsufficientFunds, available(balance, held))
		return
	}
	next := balance.Sub(e.Amount)
	p.post(c, e.Amount.Neg(), next, balances)
	p.confirms = append(p.confirms, confirmRow{id: e.ID, outcome: payment.OutcomeSuccess})
	kind := NotifyWithdrawalConfirmed
	if e.Type == payment.ReorgCompensation {
		kind = NotifyDepositReversed
	}
	p.notify(c, kind, next)
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
}

// claimTransfer picks the transfer a crediting deposit claims: the first
// of its candidates that no event holds. Candidates come from the chain
// check; without one (no RPC) a deposit is what it names, the
// transaction's own value for the native coin, or else an unresolved
// claim on its transaction. Unresolved claims count against the
// transaction's transfers of the same asset, so that no guess can credit
// one transfer twice.
func (p *batchPlan) claimTransfer(c claimedEvent, chain *ChainEvidence) bool {
	e := c.event
	k := txKey{c.network, e.TxHash}
	held := p.claims[k]
	var candidates []string
	switch {
	case chain != nil && len(chain.Transfers) > 0:
		candidates = chain.Transfers
	case e.TransferIndex != "":
		candidates = []string{e.TransferIndex}
	case c.native:
		candidates = []string{payment.TransferNative}
	default:
		for _, h := range held {
			if h.asset == e.Asset {
				return false
			}
		}
		p.addClaim(k, payment.UnresolvedTransfer(e.ID), e, nil)
		return true
	}
	if chain != nil && chain.BlockHash != "" {
		held = p.followMovedClaims(k, chain)
	}
	taken := map[string]bool{}
	unresolved := 0
	for _, h := range held {
		switch {
		case h.eventID == e.ID:
			return true // its own claim (a credit replayed after a crash)
		case payment.Unresolved(h.index) && h.asset == e.Asset:
			unresolved++
		default:
			taken[h.index] = true
		}
	}
	for _, index := range candidates {
		if taken[index] {
			continue
		}
		if unresolved > 0 {
			unresolved--
			continue
		}
		p.addClaim(k, index, e, chain)
		return true
	}
	return false
}

// followMovedClaims gives the held log claims of a transaction that was
// mined in another block when they were made the index their log has in
// the block the chain shows now: the same transfer, so still taken.
func (p *batchPlan) followMovedClaims(k txKey, chain *ChainEvidence) []transferClaim {
	held := p.claims[k]
	for i, h := range held {
		if h.position < 0 || h.blockHash == "" || h.blockHash == chain.BlockHash {
			continue
		}
		held[i].index = payment.LogIndexTransfer(uint64(chain.FirstLogIndex + h.position))
		held[i].blockHash = chain.BlockHash
		p.movedClaims = append(p.movedClaims, plannedClaim{tx: k, claim: held[i]})
	}
	return held
}

func (p *batchPlan) addClaim(k txKey, index string, e payment.Event, chain *ChainEvidence) {
	claim := transferClaim{index: index, asset: e.Asset, eventID: e.ID, position: -1}
	if n, ok := payment.LogIndex(index); ok && chain != nil && chain.BlockHash != "" {
		claim.blockHash, claim.position = chain.BlockHash, int64(n)-chain.FirstLogIndex
	}
	p.claims[k] = append(p.claims[k], claim)
	p.newClaims = append(p.newClaims, plannedClaim{tx: k, claim: claim})
}

func (p *batchPlan) post(c claimedEvent, signed, next decimal.Decimal, balances map[balanceKey]decimal.Decimal) {
	e := c.event
	k := balanceKey{e.UserID, e.Asset}
	balances[k] = next
	p.deltas[k] = p.deltas[k].Add(signed)
	p.journal = append(p.journal, journalRow{user: e.UserID, asset: e.Asset, amount: signed, eventType: e.Type.JournalType(), source: e.ID, network: c.network})
	p.outcomes[c.key] = payment.OutcomeSuccess
}

func (p *batchPlan) deadLetter(c claimedEvent, result *LedgerResult, reason, alert string) {
	e := c.event
	p.outcomes[c.key] = payment.OutcomeDeadLettered
	p.fails = append(p.fails, failRow{id: e.ID, outcome: payment.OutcomeDeadLettered, err: reason})
	p.deadLetters = append(p.deadLetters, payment.DeadLetter{
		EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
		Error: reason, Generation: e.Generation, Source: payment.SourceLedger, TraceID: e.TraceID,
	})
	p.dlqItems = append(p.dlqItems, c.item)
	result.Status, result.Outcome = payment.StatusFailed, payment.OutcomeDeadLettered
	result.Err = errors.New(reason)
	result.Alert = alert
}

func (p *batchPlan) notify(c claimedEvent, kind string, balance decimal.Decimal) {
	e := c.event
	payload, _ := json.Marshal(map[string]any{
		"delivery_id": kind + ":" + e.ID,
		"kind":        kind,
		"event_id":    e.ID,
		"event_type":  e.Type,
		"user_id":     e.UserID,
		"asset":       e.Asset,
		"amount":      e.Amount.String(),
		"balance":     balance.String(),
	})
	p.notification = append(p.notification, notificationRow{
		deliveryID: kind + ":" + e.ID, eventID: e.ID, user: e.UserID, kind: kind, payload: string(payload), traceID: e.TraceID,
	})
}

// order fixes which writes the transaction carries, in pipeline order.
func (p *batchPlan) order() {
	add := func(ok bool, kind writeKind) {
		if ok {
			p.writeKinds = append(p.writeKinds, kind)
		}
	}
	add(len(p.deltas) > 0 || len(p.heldDeltas) > 0, writeBalances)
	add(len(p.journal) > 0, writeJournal)
	add(len(p.newHolds) > 0, writeOpenHolds)
	add(len(p.resolutions) > 0, writeResolveHolds)
	add(len(p.movedClaims) > 0, writeMovedTransfers)
	add(len(p.newClaims) > 0, writeTransfers)
	add(len(p.outcomes) > len(p.reopened), writeOutcomes)
	add(len(p.reopened) > 0, writeKeyUpdates)
	add(len(p.confirms) > 0, writeConfirm)
	add(len(p.fails) > 0, writeFail)
	add(len(p.deadLetters) > 0, writeDLQ)
	add(len(p.notification) > 0, writeNotifications)
}

// queueWrites adds the planned statements to batch, in writeKinds order.
func (p *batchPlan) queueWrites(batch *pgx.Batch, notify bool) {
	var kinds []writeKind
	for _, kind := range p.writeKinds {
		switch kind {
		case writeBalances:
			keys := make([]balanceKey, 0, len(p.deltas)+len(p.heldDeltas))
			for k := range p.deltas {
				keys = append(keys, k)
			}
			for k := range p.heldDeltas {
				if _, both := p.deltas[k]; !both {
					keys = append(keys, k)
				}
			}
			sort.Slice(keys, func(i, j int) bool {
				if keys[i].user != keys[j].user {
					return keys[i].user < keys[j].user
				}
				return keys[i].asset < keys[j].asset
			})
			users, assets, deltas, heldDeltas := make([]int64, len(keys)), make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
			for i, k := range keys {
				users[i], assets[i], deltas[i], heldDeltas[i] = k.user, k.asset, p.deltas[k].String(), p.heldDeltas[k].String()
			}
			batch.Queue(q("ledger_update_balances").text, users, assets, deltas, heldDeltas)
		case writeOpenHolds:
			p.queueOpenHolds(batch)
		case writeResolveHolds:
			p.queueResolveHolds(batch)
		case writeJournal:
			n := len(p.journal)
			users, assets, amounts, types, sources := make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			networks := make([]string, n)
			for i, j := range p.journal {
				users[i], assets[i], amounts[i], types[i], sources[i] = j.user, j.asset, j.amount.String(), string(j.eventType), j.source
				networks[i] = j.network
			}
			batch.Queue(q("ledger_insert_journal").text, users, assets, amounts, types, sources, networks)
		case writeMovedTransfers:
			n := len(p.movedClaims)
			events, indexes, blocks := make([]string, n), make([]string, n), make([]string, n)
			for i, c := range p.movedClaims {
				events[i], indexes[i], blocks[i] = c.claim.eventID, c.claim.index, c.claim.blockHash
			}
			batch.Queue(q("ledger_move_claims").text, events, indexes, blocks)
		case writeTransfers:
			n := len(p.newClaims)
			networks, hashes, indexes, assets, events, blocks := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			positions := make([]int32, n)
			for i, c := range p.newClaims {
				networks[i], hashes[i], indexes[i], assets[i], events[i] = c.tx.network, c.tx.txHash, c.claim.index, c.claim.asset, c.claim.eventID
				blocks[i], positions[i] = c.claim.blockHash, int32(c.claim.position)
			}
			batch.Queue(q("ledger_claim_transfers").text, networks, hashes, indexes, assets, events, blocks, positions)
		case writeOutcomes:
			var keys, events, outcomes []string
			for k, o := range p.outcomes {
				if !p.reopened[k] {
					keys, events, outcomes = append(keys, k), append(events, p.keyEvents[k]), append(outcomes, string(o))
				}
			}
			batch.Queue(q("ledger_record_keys").text, keys, events, outcomes)
		case writeKeyUpdates:
			var keys, outcomes []string
			for k := range p.reopened {
				keys, outcomes = append(keys, k), append(outcomes, string(p.outcomes[k]))
			}
			batch.Queue(q("ledger_update_keys").text, keys, outcomes)
		case writeConfirm:
			n := len(p.confirms)
			ids, blocks, hashes, states, outcomes := make([]string, n), make([]*int64, n), make([]string, n), make([]string, n), make([]string, n)
			for i, c := range p.confirms {
				ids[i], outcomes[i] = c.id, string(c.outcome)
				if c.chain != nil {
					block := c.chain.BlockNumber
					blocks[i], hashes[i] = &block, c.chain.BlockHash
					switch {
					case c.unwatched:
					case c.chain.Watch:
						states[i] = "watching"
					default:
						states[i] = "final"
					}
				}
			}
			queueTransition(batch, q("ledger_confirm"), ids, blocks, hashes, states, outcomes)
		case writeFail:
			n := len(p.fails)
			ids, outcomes, reasons := make([]string, n), make([]string, n), make([]string, n)
			for i, f := range p.fails {
				ids[i], outcomes[i], reasons[i] = f.id, string(f.outcome), f.err
			}
			queueTransition(batch, q("ledger_fail"), ids, outcomes, reasons)
		case writeDLQ:
			queueDeadLetters(batch, p.deadLetters)
		case writeNotifications:
			if !notify {
				continue
			}
			n := len(p.notification)
			deliveries, events, users, kinds, payloads, traces := make([]string, n), make([]string, n), make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
			for i, r := range p.notification {
				deliveries[i], events[i], users[i], kinds[i], payloads[i], traces[i] = r.deliveryID, r.eventID, r.user, r.kind, r.payload, r.traceID
			}
			batch.Queue(q("insert_notifications").text, deliveries, events, users, kinds, payloads, traces)
		}
		kinds = append(kinds, kind)
	}
	p.writeKinds = kinds
}

// queueDeadLetters adds one insert of DLQ rows to batch; it returns ids.
func queueDeadLetters(batch *pgx.Batch, letters []payment.DeadLetter) {
	n := len(letters)
	ids, types, users, assets, amounts, errs := make([]string, n), make([]string, n), make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
	attempts, generations := make([]int32, n), make([]int32, n)
	sources, traces, payloads, fallbacks := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]*time.Time, n)
	for i, d := range letters {
		ids[i], types[i], users[i], assets[i], amounts[i], errs[i] = d.EventID, d.EventType, d.UserID, d.Asset, d.Amount, d.Error
		attempts[i], generations[i] = int32(d.Attempt), int32(d.Generation)
		sources[i], traces[i], payloads[i], fallbacks[i] = string(d.Source), d.TraceID, string(d.Payload), d.FallbackID
		if !d.CreatedAt.IsZero() {
			t := d.CreatedAt
			created[i] = &t
		}
	}
	batch.Queue(q("insert_dlq").text, ids, types, users, assets, amounts, errs, attempts, generations, sources, traces, payloads, created, fallbacks)
}

func durationSetting(d time.Duration) string {
	return fmt.Sprintf("%dms", d.Milliseconds())
}

// readBatch sends batch on conn and hands its results to read.
func readBatch(ctx context.Context, conn *pgxpool.Conn, batch *pgx.Batch, read func(pgx.BatchResults) error) error {
	br := conn.SendBatch(ctx, batch)
	err := read(br)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return err
}

func commit(ctx context.Context, conn *pgxpool.Conn) error {
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return classify("ledger commit", err)
	}
	if tag.String() != "COMMIT" {
		return classify("ledger commit", fmt.Errorf("transaction ended with %s", tag))
	}
	return nil
}

// rollback ends a failed transaction; a connection that cannot even roll
// back is closed so the pool never hands it out again.
func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}
