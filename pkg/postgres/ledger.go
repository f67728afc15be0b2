package postgres

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/ledger"
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

// The types of a batch live in pkg/ledger, which plans it; these names
// keep the storage's callers as they were.
type (
	ChainEvidence    = ledger.ChainEvidence
	LedgerItem       = ledger.Item
	LedgerResultKind = ledger.ResultKind
	LedgerResult     = ledger.Result
)

const (
	Applied     = ledger.Applied
	AlreadyDone = ledger.AlreadyDone
	Stale       = ledger.Stale
	Rejected    = ledger.Rejected
	Retry       = ledger.Retry
)

// ApplyBatch applies events in one transaction: lock the balances rows in
// order, lock the events, read their idempotency records, decide what
// moves (ledger.Plan, from what was read), write the journal, the records
// and the notifications, and move each event from enqueued to its
// terminal status, then commit. A returned error means nothing was
// committed and every item may be retried; per-item fates are in the
// results otherwise.
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
		users[i], assets[i] = p.User, p.Asset
		if _, known := db.knownBalances.Load(p); !known {
			newUsers, newAssets = append(newUsers, p.User), append(newAssets, p.Asset)
		}
	}
	claim := newClaim(items, live)
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(ledgerSettings(opts))
	if len(newUsers) > 0 {
		batch.Queue(q("ledger_ensure_balances").text, newUsers, newAssets)
	}
	batch.Queue(q("ledger_lock_balances").text, users, assets)
	claim.queue(batch)
	balances := map[ledger.Account]decimal.Decimal{}
	held := map[ledger.Account]decimal.Decimal{}
	var replays map[string]payment.Outcome
	if err := readBatch(ctx, conn, batch, func(br pgx.BatchResults) error {
		execs := 2 // BEGIN, ledgerSettings
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
			var k ledger.Account
			var text, heldText string
			if err := rows.Scan(&k.User, &k.Asset, &text, &heldText); err != nil {
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
				return nil, nil, payment.Retryable("ledger lock", fmt.Errorf("balance row of user %d in %s vanished", p.User, p.Asset))
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
		chain[c.Item] = items[c.Item].Chain
	}
	plan := ledger.Plan(ledger.Snapshot{
		Events: claimed, Chain: chain, Replays: replays, Balances: balances, Held: held,
		Claims: claim.claims, Payouts: claim.payouts, Holds: claim.holds, HoldEvents: claim.holdEvents, Pulled: claim.pulled,
	})
	if len(plan.Retry) > 0 {
		return nil, plan.Retry, nil
	}
	for idx, r := range plan.Results {
		results[idx] = r
	}

	// Round trip 4: every write, then COMMIT, pipelined. Anything
	// unexpected (a journal row that already exists, a balance that would
	// go negative) raises an error that aborts the transaction, so the
	// queued COMMIT becomes a rollback.
	batch = &pgx.Batch{}
	writeKinds := queueWrites(batch, plan, opts.Notify)
	batch.Queue("COMMIT")
	var dlqIDs []int64
	err = readBatch(ctx, conn, batch, func(br pgx.BatchResults) error {
		for _, kind := range writeKinds {
			if kind == writeDLQ {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				if dlqIDs, err = deadLetterIDs(rows, plan.DeadLetters); err != nil {
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
	for i, idx := range plan.DeadLetterItems {
		if i < len(dlqIDs) {
			results[idx].DeadLetterID = dlqIDs[i]
		}
	}
	return results, nil, nil
}

func balancePairs(items []LedgerItem, live []int) []ledger.Account {
	seen := map[ledger.Account]bool{}
	var pairs []ledger.Account
	for _, i := range live {
		k := ledger.Account{User: items[i].Event.UserID, Asset: items[i].Event.Asset}
		if !seen[k] {
			seen[k] = true
			pairs = append(pairs, k)
		}
	}
	sortAccounts(pairs)
	return pairs
}

// sortAccounts puts accounts in the order every transaction locks and
// updates balances rows, so that two batches never wait on each other.
func sortAccounts(keys []ledger.Account) {
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].User != keys[j].User {
			return keys[i].User < keys[j].User
		}
		return keys[i].Asset < keys[j].Asset
	})
}

// claim gathers the events a batch locks: it queues the lock and the
// read of their idempotency records into the first pipeline, then sorts
// out the tasks whose events it could not lock.
type claim struct {
	ids, types, assets, amounts, keys, txs []string
	generations                            []int32
	users                                  []int64
	itemOf                                 map[identity]int
	claimed                                []ledger.Claimed
	locked                                 map[string]bool
	// txHashes of the deposits that claim a transfer, and the claims
	// already held on those transactions.
	txHashes []string
	claims   map[ledger.Tx][]ledger.TransferClaim
	// postHashes of the posts that name a transaction, and the payout
	// claims already held on those transactions.
	postHashes []string
	payouts    map[ledger.Tx][]ledger.PayoutClaim
	// resolving are the ids of posts and voids, with their tasks' users
	// and assets; holds and holdEvents what the batch read of the holds
	// they name, pulled the hold events it locked to apply first.
	resolving       []string
	resolvingUsers  []int64
	resolvingAssets []string
	holds           map[string]*ledger.Hold
	holdEvents      map[string]payment.Status
	pulled          []ledger.Claimed
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
		if e.TxHash != "" && e.Type == payment.WithdrawalPost && !slices.Contains(c.postHashes, e.TxHash) {
			c.postHashes = append(c.postHashes, e.TxHash)
		}
		if e.Type.ResolvesHold() {
			c.resolving = append(c.resolving, e.ID)
			c.resolvingUsers, c.resolvingAssets = append(c.resolvingUsers, e.UserID), append(c.resolvingAssets, e.Asset)
		}
	}
	return c
}

func (c *claim) queue(batch *pgx.Batch) {
	batch.Queue(q("ledger_claim").text, c.ids, c.generations, c.types, c.users, c.assets, c.amounts, c.txs)
	if len(c.resolving) > 0 {
		batch.Queue(q("ledger_pull_holds").text, c.resolving, c.resolvingUsers, c.resolvingAssets, c.ids)
	}
	if len(c.txHashes) > 0 || len(c.postHashes) > 0 {
		batch.Queue(q("ledger_lock_transfers").text, append(slices.Clone(c.txHashes), c.postHashes...))
	}
	if len(c.txHashes) > 0 {
		batch.Queue(q("ledger_transfer_claims").text, c.txHashes)
	}
	if len(c.postHashes) > 0 {
		batch.Queue(q("ledger_payout_claims").text, c.postHashes)
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
	claimed, err := readClaimed(br)
	if err != nil {
		return err
	}
	for _, e := range claimed {
		e.Item = c.itemOf[identity{e.Event.ID, e.Event.Generation}]
		c.claimed = append(c.claimed, e)
		c.locked[e.Event.ID] = true
	}
	if len(c.resolving) > 0 {
		if c.pulled, err = readClaimed(br); err != nil {
			return err
		}
		for i := range c.pulled {
			c.pulled[i].Item, c.pulled[i].Pulled = -1, true
		}
	}
	if len(c.txHashes) > 0 || len(c.postHashes) > 0 {
		if _, err := br.Exec(); err != nil { // ledger_lock_transfers
			return err
		}
	}
	if len(c.txHashes) > 0 {
		if c.claims, err = readTransferClaims(br); err != nil {
			return err
		}
	}
	if len(c.postHashes) > 0 {
		if c.payouts, err = readPayoutClaims(br); err != nil {
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

// readClaimed reads event rows as ledger_claim and ledger_pull_holds
// answer them.
func readClaimed(br pgx.BatchResults) ([]ledger.Claimed, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ledger.Claimed
	for rows.Next() {
		var e ledger.Claimed
		var eventType, amount string
		var generation int32
		if err := rows.Scan(&e.Event.ID, &generation, &eventType, &e.Event.UserID, &e.Event.Asset, &amount,
			&e.Event.TraceID, &e.Related, &e.CreatedAt, &e.Event.TxHash, &e.Event.TransferIndex, &e.Network,
			&e.HoldID, &e.HoldNetwork, &e.ToAddress); err != nil {
			return nil, err
		}
		e.Event.Type = payment.EventType(eventType)
		e.Event.Amount = decimal.RequireFromString(amount)
		e.Event.Generation = int(generation)
		e.Event.HoldID, e.Event.ToAddress = e.HoldID, e.ToAddress
		if e.Event.Type == payment.WithdrawalHold {
			e.Event.Network = e.HoldNetwork
		}
		e.Key = payment.IdempotencyKey(e.Event.ID, e.Event.Type)
		out = append(out, e)
	}
	return out, rows.Err()
}

func readTransferClaims(br pgx.BatchResults) (map[ledger.Tx][]ledger.TransferClaim, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	claims := map[ledger.Tx][]ledger.TransferClaim{}
	for rows.Next() {
		var k ledger.Tx
		var t ledger.TransferClaim
		if err := rows.Scan(&k.Network, &k.TxHash, &t.Index, &t.Asset, &t.EventID, &t.BlockHash, &t.Position); err != nil {
			return nil, err
		}
		claims[k] = append(claims[k], t)
	}
	return claims, rows.Err()
}

func readPayoutClaims(br pgx.BatchResults) (map[ledger.Tx][]ledger.PayoutClaim, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	claims := map[ledger.Tx][]ledger.PayoutClaim{}
	for rows.Next() {
		var k ledger.Tx
		var t ledger.PayoutClaim
		if err := rows.Scan(&k.Network, &k.TxHash, &t.Transfer, &t.EventID); err != nil {
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
func (c *claim) settle(ctx context.Context, conn *pgxpool.Conn, items []LedgerItem, live []int, results []LedgerResult) ([]ledger.Claimed, error) {
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
		claimedItem[e.Item] = true
	}
	// A live task's event that was enqueued at its generation and still
	// was not locked either describes another event (a bad payload), or
	// moved under the claim and came back (a concurrent attempt of the
	// same generation parked it, the enqueuer handed it out again): only
	// the stored content tells which.
	var suspects []int
	for _, i := range live {
		task := items[i].Event
		if r := refused[task.ID]; !claimedItem[i] && !c.locked[task.ID] && r.Found &&
			r.Status == payment.StatusEnqueued && r.Generation == task.Generation {
			suspects = append(suspects, i)
		}
	}
	same := map[string]bool{}
	if len(suspects) > 0 {
		var err error
		if same, err = contentMatches(ctx, conn, items, suspects); err != nil {
			return nil, err
		}
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
			results[i] = LedgerResult{Kind: AlreadyDone, Status: r.Status, Outcome: r.Outcome}
			if task.Type == payment.ReorgCompensation && r.Outcome == payment.OutcomeDeadLettered {
				// The attempt that dead-lettered it may never have told its
				// worker (a commit whose answer was lost, a worker gone
				// after it): the alert it owes is raised by whoever sees it.
				results[i].Alert = fmt.Sprintf("reorg compensation %s is dead-lettered (the available balance did not cover it): settle by hand", task.ID)
			}
		case r.Status == payment.StatusEnqueued && r.Generation == task.Generation && same[task.ID]:
			results[i] = LedgerResult{Kind: Retry, Status: r.Status,
				Err: payment.Retryable("ledger claim", fmt.Errorf("event %s moved while the batch claimed it", task.ID))}
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
	NotifyDepositCredited     = ledger.NotifyDepositCredited
	NotifyWithdrawalConfirmed = ledger.NotifyWithdrawalConfirmed
	NotifyInsufficientFunds   = ledger.NotifyInsufficientFunds
	NotifyDepositReversed     = ledger.NotifyDepositReversed
	NotifyWithdrawalPosted    = ledger.NotifyWithdrawalPosted
	NotifyHoldVoided          = ledger.NotifyHoldVoided
)

type writeKind int

const (
	writeBalances writeKind = iota
	writeJournal
	writeMovedTransfers
	writeTransfers
	writePayouts
	writeOutcomes
	writeKeyUpdates
	writeConfirm
	writeFail
	writeDLQ
	writeNotifications
	writeOpenHolds
	writeResolveHolds
)

// writeOrder fixes which writes the transaction carries, in pipeline order.
func writeOrder(w *ledger.Writes) []writeKind {
	var kinds []writeKind
	add := func(ok bool, kind writeKind) {
		if ok {
			kinds = append(kinds, kind)
		}
	}
	add(len(w.Deltas) > 0 || len(w.HeldDeltas) > 0, writeBalances)
	add(len(w.Journal) > 0, writeJournal)
	add(len(w.OpenHolds) > 0, writeOpenHolds)
	add(len(w.Resolutions) > 0, writeResolveHolds)
	add(len(w.MovedClaims) > 0, writeMovedTransfers)
	add(len(w.NewClaims) > 0, writeTransfers)
	add(len(w.NewPayouts) > 0, writePayouts)
	add(len(w.Outcomes) > len(w.Reopened), writeOutcomes)
	add(len(w.Reopened) > 0, writeKeyUpdates)
	add(len(w.Confirms) > 0, writeConfirm)
	add(len(w.Fails) > 0, writeFail)
	add(len(w.DeadLetters) > 0, writeDLQ)
	add(len(w.Notifications) > 0, writeNotifications)
	return kinds
}

// queueWrites adds the planned statements to batch, in writeOrder's
// order; it returns the kinds it queued, one result each.
func queueWrites(batch *pgx.Batch, w *ledger.Writes, notify bool) []writeKind {
	var kinds []writeKind
	for _, kind := range writeOrder(w) {
		switch kind {
		case writeBalances:
			keys := make([]ledger.Account, 0, len(w.Deltas)+len(w.HeldDeltas))
			for k := range w.Deltas {
				keys = append(keys, k)
			}
			for k := range w.HeldDeltas {
				if _, both := w.Deltas[k]; !both {
					keys = append(keys, k)
				}
			}
			sortAccounts(keys)
			users, assets, deltas, heldDeltas := make([]int64, len(keys)), make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
			for i, k := range keys {
				users[i], assets[i], deltas[i], heldDeltas[i] = k.User, k.Asset, w.Deltas[k].String(), w.HeldDeltas[k].String()
			}
			batch.Queue(q("ledger_update_balances").text, users, assets, deltas, heldDeltas)
		case writeOpenHolds:
			queueOpenHolds(batch, w.OpenHolds)
		case writeResolveHolds:
			queueResolveHolds(batch, w.Resolutions)
		case writeJournal:
			n := len(w.Journal)
			users, assets, amounts, types, sources := make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			networks := make([]string, n)
			for i, j := range w.Journal {
				users[i], assets[i], amounts[i], types[i], sources[i] = j.User, j.Asset, j.Amount.String(), string(j.EventType), j.Source
				networks[i] = j.Network
			}
			batch.Queue(q("ledger_insert_journal").text, users, assets, amounts, types, sources, networks)
		case writeMovedTransfers:
			n := len(w.MovedClaims)
			events, indexes, blocks := make([]string, n), make([]string, n), make([]string, n)
			for i, c := range w.MovedClaims {
				events[i], indexes[i], blocks[i] = c.Claim.EventID, c.Claim.Index, c.Claim.BlockHash
			}
			batch.Queue(q("ledger_move_claims").text, events, indexes, blocks)
		case writeTransfers:
			n := len(w.NewClaims)
			networks, hashes, indexes, assets, events, blocks := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			positions := make([]int32, n)
			for i, c := range w.NewClaims {
				networks[i], hashes[i], indexes[i], assets[i], events[i] = c.Tx.Network, c.Tx.TxHash, c.Claim.Index, c.Claim.Asset, c.Claim.EventID
				blocks[i], positions[i] = c.Claim.BlockHash, int32(c.Claim.Position)
			}
			batch.Queue(q("ledger_claim_transfers").text, networks, hashes, indexes, assets, events, blocks, positions)
		case writePayouts:
			n := len(w.NewPayouts)
			networks, hashes, transfers, indexes, blocks, assets, events := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			for i, c := range w.NewPayouts {
				networks[i], hashes[i], transfers[i], indexes[i] = c.Tx.Network, c.Tx.TxHash, c.Claim.Transfer, c.Claim.Index
				blocks[i], assets[i], events[i] = c.Claim.BlockHash, c.Claim.Asset, c.Claim.EventID
			}
			batch.Queue(q("ledger_claim_payouts").text, networks, hashes, transfers, indexes, blocks, assets, events)
		case writeOutcomes:
			var keys, events, outcomes []string
			for k, o := range w.Outcomes {
				if !w.Reopened[k] {
					keys, events, outcomes = append(keys, k), append(events, w.KeyEvents[k]), append(outcomes, string(o))
				}
			}
			batch.Queue(q("ledger_record_keys").text, keys, events, outcomes)
		case writeKeyUpdates:
			var keys, outcomes []string
			for k := range w.Reopened {
				keys, outcomes = append(keys, k), append(outcomes, string(w.Outcomes[k]))
			}
			batch.Queue(q("ledger_update_keys").text, keys, outcomes)
		case writeConfirm:
			n := len(w.Confirms)
			ids, blocks, hashes, states, outcomes := make([]string, n), make([]*int64, n), make([]string, n), make([]string, n), make([]string, n)
			for i, c := range w.Confirms {
				ids[i], outcomes[i] = c.ID, string(c.Outcome)
				if c.Chain != nil {
					block := c.Chain.BlockNumber
					blocks[i], hashes[i] = &block, c.Chain.BlockHash
					states[i] = "final"
					if c.Chain.Watch {
						states[i] = "watching"
					}
				}
			}
			queueTransition(batch, q("ledger_confirm"), ids, blocks, hashes, states, outcomes)
		case writeFail:
			n := len(w.Fails)
			ids, outcomes, reasons := make([]string, n), make([]string, n), make([]string, n)
			for i, f := range w.Fails {
				ids[i], outcomes[i], reasons[i] = f.ID, string(f.Outcome), f.Err
			}
			queueTransition(batch, q("ledger_fail"), ids, outcomes, reasons)
		case writeDLQ:
			queueDeadLetters(batch, w.DeadLetters)
		case writeNotifications:
			if !notify {
				continue
			}
			n := len(w.Notifications)
			deliveries, events, users, kinds, payloads, traces := make([]string, n), make([]string, n), make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
			for i, r := range w.Notifications {
				deliveries[i], events[i], users[i], kinds[i], payloads[i], traces[i] = r.DeliveryID, r.EventID, r.User, r.Kind, r.Payload, r.TraceID
			}
			batch.Queue(q("insert_notifications").text, deliveries, events, users, kinds, payloads, traces)
		}
		kinds = append(kinds, kind)
	}
	return kinds
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

// durationSetting is d as a PostgreSQL timeout setting, in whole
// milliseconds rounded up: truncated, a positive d under a millisecond
// was '0ms', which PostgreSQL takes for no timeout at all.
func durationSetting(d time.Duration) string {
	return fmt.Sprintf("%dms", (d + time.Millisecond - 1).Milliseconds())
}

// ledgerSettings is one statement for the hot path's plan settings and
// the ledger's timeouts, as literals: one statement fewer per transaction
// than the timeouts as parameters, and with no parameter it is never
// planned afresh. Its text is fixed by the options, so it is prepared
// once per connection.
//
// The transaction is also bounded while it waits for its client: between
// round trips a worker only plans in memory, so one idle in it longer
// than a statement may run is frozen or cut off (a paused VM, a lost
// node). PostgreSQL then ends its session and the balance rows it locked
// go to the other workers, instead of failing their batches until the
// kernel gives the socket up, hours later.
func ledgerSettings(opts LedgerOptions) string {
	key := [2]time.Duration{opts.LockTimeout, opts.StatementTimeout}
	if last := lastLedgerSettings.Load(); last != nil && last.key == key {
		return last.text
	}
	plans := strings.TrimSuffix(strings.TrimSpace(q("hot_path_plans").text), ";")
	text := fmt.Sprintf("%s, set_config('lock_timeout', '%s', true), set_config('statement_timeout', '%s', true), "+
		"set_config('idle_in_transaction_session_timeout', '%s', true)",
		plans, durationSetting(opts.LockTimeout), durationSetting(opts.StatementTimeout), durationSetting(opts.StatementTimeout))
	lastLedgerSettings.Store(&ledgerSettingsText{key: key, text: text})
	return text
}

// lastLedgerSettings keeps the last text ledgerSettings built: a process
// runs with one set of timeouts, and the text was formatted again for
// every transaction.
var lastLedgerSettings atomic.Pointer[ledgerSettingsText]

type ledgerSettingsText struct {
	key  [2]time.Duration
	text string
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

// contentMatches names the events of items[at] whose stored row has the
// task's content (type, user, asset, amount, transaction).
func contentMatches(ctx context.Context, conn *pgxpool.Conn, items []LedgerItem, at []int) (map[string]bool, error) {
	n := len(at)
	ids, types, assets, amounts, txs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	users := make([]int64, n)
	for k, i := range at {
		e := items[i].Event
		ids[k], types[k], users[k], assets[k], amounts[k], txs[k] = e.ID, string(e.Type), e.UserID, e.Asset, e.Amount.String(), e.TxHash
	}
	stmt := q("ledger_content_matches")
	rows, err := conn.Query(ctx, stmt.text, ids, types, users, assets, amounts, txs)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	matched, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out := make(map[string]bool, len(matched))
	for _, id := range matched {
		out[id] = true
	}
	return out, nil
}
