// Package ledger decides what a batch of events does to the money: which
// deposits credit, which debits fit in the available balance, which
// transfer a deposit claims, what a hold reserves and releases, what goes
// to the dead-letter queue and whom to tell. It is pure: Plan is a function
// of what the storage read inside its transaction (a Snapshot), and returns
// every row to write (Writes). Reading, locking and writing are
// pkg/postgres's job.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

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

// Item asks for one event to be applied. Event comes from the task: its
// id and generation select the row; its other fields must match the row,
// and the row's values are the ones that move money.
type Item struct {
	Event payment.Event
	Chain *ChainEvidence
}

// ResultKind says what a batch did for an item.
type ResultKind int

const (
	// Applied: this transaction made the event terminal with Outcome.
	Applied ResultKind = iota + 1
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

func (k ResultKind) String() string {
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

// Result is the fate of one item.
type Result struct {
	Kind    ResultKind
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

// Notification kinds written to notification_outbox.
const (
	NotifyDepositCredited     = "deposit_credited"
	NotifyWithdrawalConfirmed = "withdrawal_confirmed"
	NotifyInsufficientFunds   = "insufficient_funds"
	NotifyDepositReversed     = "deposit_reversed"
	NotifyWithdrawalPosted    = "withdrawal_posted"
	NotifyHoldVoided          = "hold_voided"
)

// Account is one balances row: a user's balance in an asset.
type Account struct {
	User  int64
	Asset string
}

// Claimed is an event row the transaction locked, with the values that
// count.
type Claimed struct {
	Event     payment.Event
	Related   string
	CreatedAt time.Time
	// Key is the event's idempotency key.
	Key string
	// Item is the index of the item that asked for the event; results,
	// chain evidence and retries are keyed by it.
	Item int
	// Network is where the event's transfer lives.
	Network string
	// HoldID is the hold a post or void resolves; HoldNetwork and
	// ToAddress say where a hold pays out.
	HoldID      string
	HoldNetwork string
	ToAddress   string
	// Pulled: a hold event no task of the batch carries, locked because a
	// post or void of the batch names it (Snapshot.Pulled); Item is -1.
	Pulled bool
}

// Tx names a transaction on a network.
type Tx struct {
	Network string
	TxHash  string
}

// TransferClaim is a chain_transfers row.
type TransferClaim struct {
	Index   string
	Asset   string
	EventID string
	// BlockHash and Position (-1: not a log) say where the claimed log
	// was when it was claimed.
	BlockHash string
	Position  int64
}

// PlannedClaim is a claim to write, on its transaction.
type PlannedClaim struct {
	Tx    Tx
	Claim TransferClaim
}

// JournalRow is one ledger_journal row.
type JournalRow struct {
	User      int64
	Asset     string
	Amount    decimal.Decimal
	EventType payment.EventType
	Source    string
	Network   string
}

// Confirm moves an event to confirmed.
type Confirm struct {
	ID      string
	Chain   *ChainEvidence
	Outcome payment.Outcome
}

// Fail moves an event to failed.
type Fail struct {
	ID      string
	Outcome payment.Outcome
	Err     string
}

// Notification is one notification_outbox row.
type Notification struct {
	DeliveryID string
	EventID    string
	User       int64
	Kind       string
	Payload    string
	TraceID    string
}

// Snapshot is what the transaction read under its locks. Plan leaves it
// as it was.
type Snapshot struct {
	// Events are the locked events.
	Events []Claimed
	// Chain is the chain evidence of each item, by Claimed.Item.
	Chain map[int]*ChainEvidence
	// Replays are the outcomes already recorded, by idempotency key.
	Replays map[string]payment.Outcome
	// Balances and Held are the locked balances rows: a missing account
	// is an unknown user or asset.
	Balances map[Account]decimal.Decimal
	Held     map[Account]decimal.Decimal
	// Claims are the transfer claims held on the deposits' transactions,
	// Payouts those held on the posts'.
	Claims  map[Tx][]TransferClaim
	Payouts map[Tx][]PayoutClaim
	// Holds are the holds rows the batch's posts and voids name (locked),
	// and HoldEvents the statuses of those holds' events.
	Holds      map[string]*Hold
	HoldEvents map[string]payment.Status
	// Pulled are hold events, enqueued at their first generation and
	// unapplied, that the batch's posts and voids name and the storage
	// locked with their accounts: Plan applies them in turn as if their
	// tasks were here, so a post that overtook its hold in the queue does
	// not wait for it. Their tasks later find them terminal.
	Pulled []Claimed
}

// Writes is everything one transaction will write, decided from the
// locked balances before a single write is sent.
type Writes struct {
	// Results are the fates of the planned items, by item.
	Results map[int]Result
	// Retry names items the transaction must roll back for and run
	// without (a pending idempotency key).
	Retry map[int]error

	// Deltas and HeldDeltas change balances.balance and balances.held.
	Deltas     map[Account]decimal.Decimal
	HeldDeltas map[Account]decimal.Decimal
	Journal    []JournalRow
	// NewClaims are the transfer claims to write; MovedClaims are held
	// claims whose transaction is now mined in another block, with the
	// log index their transfer has there.
	NewClaims   []PlannedClaim
	MovedClaims []PlannedClaim
	// NewPayouts are the transfers that posts settle with, to write.
	NewPayouts []PlannedPayout
	// Outcomes to record, by idempotency key, with their event ids
	// (KeyEvents); Reopened keys exist already (a dead-lettered attempt)
	// and are updated.
	Outcomes  map[string]payment.Outcome
	KeyEvents map[string]string
	Reopened  map[string]bool
	Confirms  []Confirm
	Fails     []Fail
	// DeadLetters are the DLQ rows, DeadLetterItems their items.
	DeadLetters     []payment.DeadLetter
	DeadLetterItems []int
	Notifications   []Notification
	// OpenHolds are the holds rows to insert, Resolutions the holds to
	// post or void.
	OpenHolds   []Hold
	Resolutions []HoldResolution
	// PulledResults are the fates of the pulled hold events Plan applied,
	// by event id (they have no item).
	PulledResults map[string]Result

	// Balances and Held are the accounts as the batch leaves them.
	Balances map[Account]decimal.Decimal
	Held     map[Account]decimal.Decimal
}

// planner is one Plan's running state.
type planner struct {
	w          *Writes
	balances   map[Account]decimal.Decimal
	held       map[Account]decimal.Decimal
	holds      map[string]*Hold
	holdEvents map[string]payment.Status
	// pulled are the pulled hold events not yet applied, by id.
	pulled  map[string]Claimed
	replays map[string]payment.Outcome
	// claims on each transaction, held before and planned here; payouts
	// the same for posts.
	claims  map[Tx][]TransferClaim
	payouts map[Tx][]PayoutClaim
}

// Plan decides each claimed event's fate against the running balances,
// in (user, asset, accepted-at) order so that a user's withdrawals are
// served first come, first served.
func Plan(s Snapshot) *Writes {
	w := &Writes{
		Results:    map[int]Result{},
		Retry:      map[int]error{},
		Deltas:     map[Account]decimal.Decimal{},
		HeldDeltas: map[Account]decimal.Decimal{},
		Outcomes:   map[string]payment.Outcome{},
		KeyEvents:  map[string]string{},
		Reopened:   map[string]bool{},

		PulledResults: map[string]Result{},
	}
	p := &planner{
		w:          w,
		balances:   copyMap(s.Balances),
		held:       copyMap(s.Held),
		holds:      map[string]*Hold{},
		holdEvents: copyMap(s.HoldEvents),
		pulled:     map[string]Claimed{},
		replays:    s.Replays,
		claims:     map[Tx][]TransferClaim{},
		payouts:    map[Tx][]PayoutClaim{},
	}
	w.Balances, w.Held = p.balances, p.held
	for id, h := range s.Holds {
		if h != nil {
			row := *h
			p.holds[id] = &row
		}
	}
	for k, held := range s.Claims {
		p.claims[k] = slices.Clone(held)
	}
	for k, held := range s.Payouts {
		p.payouts[k] = slices.Clone(held)
	}
	claimed := slices.Clone(s.Events)
	for _, c := range claimed {
		w.KeyEvents[c.Key] = c.Event.ID
	}
	for _, c := range s.Pulled {
		if _, carried := w.KeyEvents[c.Key]; carried {
			continue // a task of the batch carries it: it takes its own turn
		}
		c.Pulled, c.Item = true, -1
		p.pulled[c.Event.ID] = c
		claimed = append(claimed, c)
	}
	sort.SliceStable(claimed, func(i, j int) bool {
		a, b := claimed[i], claimed[j]
		if a.Event.UserID != b.Event.UserID {
			return a.Event.UserID < b.Event.UserID
		}
		if a.Event.Asset != b.Event.Asset {
			return a.Event.Asset < b.Event.Asset
		}
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.Before(b.CreatedAt)
		}
		return a.Event.ID < b.Event.ID
	})
	for _, c := range claimed {
		if c.Pulled {
			p.pull(c.Event.ID)
			continue
		}
		result := Result{Kind: Applied, CreatedAt: c.CreatedAt, Event: c.Event}
		prior, seen := s.Replays[c.Key]
		if seen && !prior.Reopenable() {
			// Replay path: the key was written before; bring the event to
			// the status its recorded outcome implies, without moving money.
			switch {
			case prior.Confirms():
				w.Confirms = append(w.Confirms, Confirm{ID: c.Event.ID, Outcome: prior})
				result.Status, result.Outcome = payment.StatusConfirmed, prior
			case prior == payment.OutcomePending:
				// A pending key that committed belongs to no live
				// transaction; retry later and let the zombie check report it.
				w.Retry[c.Item] = payment.Retryable("ledger replay", fmt.Errorf("idempotency key of %s is still pending", c.Event.ID))
				continue
			default:
				w.Fails = append(w.Fails, Fail{ID: c.Event.ID, Outcome: prior})
				result.Status, result.Outcome = payment.StatusFailed, prior
			}
			w.Results[c.Item] = result
			continue
		}
		if !p.apply(c, s.Chain[c.Item], &result) {
			continue
		}
		if _, decided := w.Outcomes[c.Key]; decided && seen {
			// A key written before (its attempt dead-lettered) is updated,
			// not inserted; only once apply has given it an outcome: an
			// event that waits (a post for its hold) writes no key at all.
			w.Reopened[c.Key] = true
		}
		w.Results[c.Item] = result
	}
	return w
}

func copyMap[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return maps.Clone(m)
}

// apply moves money for a first-time event (or one whose last attempt was
// dead-lettered and a human replayed it). It reports false when the item
// must wait for another transaction (its result says why).
func (p *planner) apply(c Claimed, chain *ChainEvidence, result *Result) bool {
	e := c.Event
	k := Account{e.UserID, e.Asset}
	balance, exists := p.balances[k]
	switch {
	case !exists:
		p.deadLetter(c, result, fmt.Sprintf("user %d or asset %s is unknown", e.UserID, e.Asset), "")
	case e.Type == payment.WithdrawalHold:
		p.reserve(c, k, balance, result)
	case e.Type.ResolvesHold():
		return p.resolve(c, k, balance, chain, result)
	default:
		p.move(c, k, balance, chain, result)
	}
	return true
}

// move credits or debits the balance; a debit takes only from available.
func (p *planner) move(c Claimed, k Account, balance decimal.Decimal, chain *ChainEvidence, result *Result) {
	e := c.Event
	w := p.w
	if e.Type.Credit() {
		next := balance.Add(e.Amount)
		if !money.FitsBalance(next) {
			p.deadLetter(c, result, fmt.Sprintf("crediting %s %s would take the balance of user %d past 10^20", e.Amount, e.Asset, e.UserID), "")
			return
		}
		if e.TxHash != "" && !p.claimTransfer(c, chain) {
			// Another event holds every transfer this deposit could be: the
			// money arrived once and was credited once.
			w.Outcomes[c.Key] = payment.OutcomeDuplicateTransfer
			w.Fails = append(w.Fails, Fail{ID: e.ID, Outcome: payment.OutcomeDuplicateTransfer,
				Err: fmt.Sprintf("transfer of %s already credited to another event", e.TxHash)})
			result.Status, result.Outcome = payment.StatusFailed, payment.OutcomeDuplicateTransfer
			return
		}
		p.post(c, e.Amount, next)
		w.Confirms = append(w.Confirms, Confirm{ID: e.ID, Chain: chain, Outcome: payment.OutcomeSuccess})
		p.notify(c, k, NotifyDepositCredited, next)
		result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
		return
	}
	if held := p.held[k]; !canDebit(balance, held, e.Amount) {
		if e.Type == payment.ReorgCompensation {
			reason := fmt.Sprintf("reorg compensation of %s %s exceeds the available balance of user %d (%s, of which %s held): settle by hand",
				e.Amount, e.Asset, e.UserID, balance, held)
			p.deadLetter(c, result, reason, reason)
			return
		}
		p.refuse(c, result, payment.OutcomeInsufficientFunds, "")
		p.notify(c, k, NotifyInsufficientFunds, balance)
		return
	}
	next := balance.Sub(e.Amount)
	p.post(c, e.Amount.Neg(), next)
	w.Confirms = append(w.Confirms, Confirm{ID: e.ID, Outcome: payment.OutcomeSuccess})
	kind := NotifyWithdrawalConfirmed
	if e.Type == payment.ReorgCompensation {
		kind = NotifyDepositReversed
	}
	p.notify(c, k, kind, next)
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
}

// claimTransfer picks the transfer a crediting deposit claims: the first
// of its candidates that no event holds. Candidates come from the chain
// check; without one (no RPC) a deposit is what it names, or else an
// unresolved claim on its transaction. Unresolved claims count against
// the transaction's transfers of the same asset, so that no guess can
// credit one transfer twice: a native deposit naming none may be the
// transaction's own value or ETH a contract call inside it paid
// (trace:<address>), which a provider reports under that index.
func (p *planner) claimTransfer(c Claimed, chain *ChainEvidence) bool {
	e := c.Event
	k := Tx{c.Network, e.TxHash}
	held := p.claims[k]
	var candidates []string
	switch {
	case chain != nil && len(chain.Transfers) > 0:
		candidates = chain.Transfers
	case e.TransferIndex != "":
		candidates = []string{e.TransferIndex}
	default:
		if slices.ContainsFunc(held, func(h TransferClaim) bool { return h.EventID == e.ID }) {
			return true // its own claim (a credit replayed after a crash)
		}
		if slices.ContainsFunc(held, func(h TransferClaim) bool { return h.Asset == e.Asset }) {
			return false
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
		case h.EventID == e.ID:
			return true // its own claim (a credit replayed after a crash)
		case payment.Unresolved(h.Index) && h.Asset == e.Asset:
			unresolved++
		default:
			taken[h.Index] = true
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
func (p *planner) followMovedClaims(k Tx, chain *ChainEvidence) []TransferClaim {
	held := p.claims[k]
	for i, h := range held {
		if h.Position < 0 || h.BlockHash == "" || h.BlockHash == chain.BlockHash {
			continue
		}
		at := chain.FirstLogIndex + h.Position
		if at < 0 {
			continue // no log has a negative index: evidence from no receipt
		}
		held[i].Index = payment.LogIndexTransfer(uint64(at))
		held[i].BlockHash = chain.BlockHash
		p.w.MovedClaims = append(p.w.MovedClaims, PlannedClaim{Tx: k, Claim: held[i]})
	}
	return held
}

func (p *planner) addClaim(k Tx, index string, e payment.Event, chain *ChainEvidence) {
	claim := TransferClaim{Index: index, Asset: e.Asset, EventID: e.ID, Position: -1}
	// A log index past int64 is no block's; such a claim keeps no position.
	if n, ok := payment.LogIndex(index); ok && n <= math.MaxInt64 && chain != nil && chain.BlockHash != "" {
		claim.BlockHash, claim.Position = chain.BlockHash, int64(n)-chain.FirstLogIndex
	}
	p.claims[k] = append(p.claims[k], claim)
	p.w.NewClaims = append(p.w.NewClaims, PlannedClaim{Tx: k, Claim: claim})
}

func (p *planner) post(c Claimed, signed, next decimal.Decimal) {
	e := c.Event
	k := Account{e.UserID, e.Asset}
	p.balances[k] = next
	p.w.Deltas[k] = p.w.Deltas[k].Add(signed)
	p.w.Journal = append(p.w.Journal, JournalRow{User: e.UserID, Asset: e.Asset, Amount: signed, EventType: e.Type.JournalType(), Source: e.ID, Network: c.Network})
	p.w.Outcomes[c.Key] = payment.OutcomeSuccess
}

func (p *planner) deadLetter(c Claimed, result *Result, reason, alert string) {
	e := c.Event
	w := p.w
	w.Outcomes[c.Key] = payment.OutcomeDeadLettered
	w.Fails = append(w.Fails, Fail{ID: e.ID, Outcome: payment.OutcomeDeadLettered, Err: reason})
	w.DeadLetters = append(w.DeadLetters, payment.DeadLetter{
		EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
		Error: reason, Generation: e.Generation, Source: payment.SourceLedger, TraceID: e.TraceID,
		// The generation's one failure: a worker's letter for it parked
		// in Redis drains into nothing.
		FallbackID: payment.FailureKey(e.ID, e.Generation),
	})
	w.DeadLetterItems = append(w.DeadLetterItems, c.Item)
	result.Status, result.Outcome = payment.StatusFailed, payment.OutcomeDeadLettered
	result.Err = errors.New(reason)
	result.Alert = alert
}

// notificationPayload is a notification's body. A struct, not a map: a
// map is built, sorted and reflected key by key for every event, 25 of
// the 74 allocations of a deposit's plan. The fields are in the map's
// (sorted) key order, so the text is the same.
type notificationPayload struct {
	Amount     string            `json:"amount"`
	Asset      string            `json:"asset"`
	Available  string            `json:"available"`
	Balance    string            `json:"balance"`
	DeliveryID string            `json:"delivery_id"`
	EventID    string            `json:"event_id"`
	EventType  payment.EventType `json:"event_type"`
	Kind       string            `json:"kind"`
	UserID     int64             `json:"user_id"`
}

// notify writes the user's notification of what the event did: the
// balance after it, and what of it is available (not held) then, as the
// plan stands for account k.
func (p *planner) notify(c Claimed, k Account, kind string, balance decimal.Decimal) {
	e := c.Event
	payload, _ := json.Marshal(notificationPayload{
		DeliveryID: kind + ":" + e.ID, Kind: kind, EventID: e.ID, EventType: e.Type, UserID: e.UserID,
		Asset: e.Asset, Amount: e.Amount.String(), Balance: balance.String(), Available: available(balance, p.held[k]).String(),
	})
	p.w.Notifications = append(p.w.Notifications, Notification{
		DeliveryID: kind + ":" + e.ID, EventID: e.ID, User: e.UserID, Kind: kind, Payload: string(payload), TraceID: e.TraceID,
	})
}
