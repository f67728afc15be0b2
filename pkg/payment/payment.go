// Package payment holds the domain of settle: event types, the status
// machine, outcomes, idempotency keys and error kinds. It depends on no
// database, queue or HTTP package.
package payment

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
)

// EventType says what an event does to a balance.
type EventType string

const (
	Deposit           EventType = "deposit"
	Airdrop           EventType = "airdrop"
	Withdrawal        EventType = "withdrawal"
	WithdrawalFee     EventType = "withdrawal_fee"
	ReorgCompensation EventType = "reorg_compensation"
	// WithdrawalHold reserves money of the user's available balance; its
	// event id is the hold id.
	WithdrawalHold EventType = "withdrawal_hold"
	// WithdrawalPost turns an open hold into a debit, once the payment
	// went out (on chain, when it names a tx_hash).
	WithdrawalPost EventType = "withdrawal_post"
	// WithdrawalVoid releases an open hold.
	WithdrawalVoid EventType = "withdrawal_void"
)

// EventTypes lists every type the ledger knows, in a fixed order.
var EventTypes = []EventType{Deposit, Airdrop, Withdrawal, WithdrawalFee, ReorgCompensation, WithdrawalHold, WithdrawalPost, WithdrawalVoid}

// WebhookEventTypes are the types a caller may submit; compensations are
// only ever created by settle itself.
var WebhookEventTypes = []EventType{Deposit, Airdrop, Withdrawal, WithdrawalFee, WithdrawalHold, WithdrawalPost, WithdrawalVoid}

// ParseWebhookEventType accepts only the whitelisted caller-facing types.
func ParseWebhookEventType(s string) (EventType, bool) {
	for _, t := range WebhookEventTypes {
		if string(t) == s {
			return t, true
		}
	}
	return "", false
}

// Known reports whether the ledger can process the type.
func (t EventType) Known() bool {
	for _, k := range EventTypes {
		if k == t {
			return true
		}
	}
	return false
}

// Credit reports whether the type adds to the balance; the others debit it.
func (t EventType) Credit() bool { return t == Deposit || t == Airdrop }

// ChainGated reports whether an event of this type with a tx_hash waits for
// the chain's finality policy before the ledger applies it: a credit, or
// a post paying its hold out on chain.
func (t EventType) ChainGated() bool { return t.Credit() || t == WithdrawalPost }

// ResolvesHold reports whether the type names a hold (hold_id) it posts
// or voids.
func (t EventType) ResolvesHold() bool { return t == WithdrawalPost || t == WithdrawalVoid }

// JournalType is the event_type of the journal row an event of this type
// writes: a post debits as a withdrawal.
func (t EventType) JournalType() EventType {
	if t == WithdrawalPost {
		return Withdrawal
	}
	return t
}

// Outcome is the business result recorded in processed_events and on the
// terminal event.
type Outcome string

const (
	OutcomePending           Outcome = "pending"
	OutcomeSuccess           Outcome = "success"
	OutcomeInsufficientFunds Outcome = "insufficient_funds"
	OutcomeReorged           Outcome = "reorged"
	OutcomeReverted          Outcome = "reverted"
	OutcomeNotFound          Outcome = "not_found"
	OutcomeMismatch          Outcome = "mismatch"
	// OutcomeDuplicateTransfer: the deposit's on-chain transfer was
	// already credited to another event.
	OutcomeDuplicateTransfer Outcome = "duplicate_transfer"
	// OutcomeHeld: a withdrawal_hold reserved its amount (status
	// confirmed, no journal row).
	OutcomeHeld Outcome = "held"
	// OutcomeHoldClosed: a post or void of a hold already posted or voided.
	OutcomeHoldClosed Outcome = "hold_closed"
	// OutcomeUnknownHold: a post or void of a hold that does not exist (or
	// never reserved anything), or that belongs to another user.
	OutcomeUnknownHold Outcome = "unknown_hold"
	// OutcomeReopened is recorded in processed_events only: a failed
	// deposit whose transaction the chain shows again, sent back to the
	// ledger, which treats it as a first attempt.
	OutcomeReopened Outcome = "reopened"
	// OutcomeDeadLettered marks a failure that a human must look at: the
	// event has a dead_letter_queue row.
	OutcomeDeadLettered Outcome = "dead_lettered"
)

// BusinessFailures are the outcomes that end an event failed without a DLQ
// row: the system worked, the payment simply cannot go through.
var BusinessFailures = []Outcome{OutcomeInsufficientFunds, OutcomeReorged, OutcomeReverted, OutcomeNotFound, OutcomeMismatch, OutcomeDuplicateTransfer,
	OutcomeHoldClosed, OutcomeUnknownHold}

// Confirms reports whether a recorded outcome leaves its event confirmed.
func (o Outcome) Confirms() bool { return o == OutcomeSuccess || o == OutcomeHeld }

// Reopenable reports whether a recorded outcome lets the event run again
// as a first attempt (a human replayed its dead letter, or the chain shows
// its transaction again).
func (o Outcome) Reopenable() bool { return o == OutcomeDeadLettered || o == OutcomeReopened }

// RecheckOutcomes are the failed deposits' outcomes a recheck may reverse.
var RecheckOutcomes = []Outcome{OutcomeReorged, OutcomeNotFound, OutcomeMismatch, OutcomeReverted}

// IdempotencyKey is the lowercase hex SHA-256 of the length-prefixed
// fields: a 4-byte big-endian length and the UTF-8 bytes of the event id,
// then the same for the event type. Length prefixes make the encoding
// injective; "a::b" joins and NUL separators both collided.
func IdempotencyKey(eventID string, eventType EventType) string {
	h := sha256.New()
	writeField(h, eventID)
	writeField(h, string(eventType))
	return hex.EncodeToString(h.Sum(nil))
}

type byteWriter interface{ Write([]byte) (int, error) }

func writeField(w byteWriter, field string) {
	var length [4]byte
	// Fields are bounded far below 4 GiB (ids of 256 characters, amounts,
	// hashes, names): the prefix cannot wrap.
	binary.BigEndian.PutUint32(length[:], uint32(len(field))) //nolint:gosec // G115: see above

	_, _ = w.Write(length[:])
	_, _ = w.Write([]byte(field))
}

// Content is what identifies an event's meaning: a redelivery with the same
// event id must carry the same content, or it is a conflict.
type Content struct {
	Type   EventType
	UserID int64
	Asset  string
	Amount decimal.Decimal
	TxHash string // lowercase, or empty
	// TransferIndex is the transfer a deposit names within its
	// transaction, or empty.
	TransferIndex string
	// HoldID is the hold a post or void resolves; Network and ToAddress
	// (lowercase) say where a hold's money goes. Empty when not set.
	HoldID    string
	Network   string
	ToAddress string
}

// Hash is a SHA-256 over the length-prefixed canonical fields; amounts are
// compared by value ("50" equals "50.0") because they are canonicalised.
func (c Content) Hash() []byte {
	h := sha256.New()
	writeField(h, string(c.Type))
	writeField(h, strconv.FormatInt(c.UserID, 10))
	writeField(h, c.Asset)
	writeField(h, money.Canonical(c.Amount))
	writeField(h, strings.ToLower(c.TxHash))
	// Written only when set, so the hashes of events stored before the
	// field existed do not change; a field more cannot collide under the
	// length prefixes.
	if c.TransferIndex != "" {
		writeField(h, c.TransferIndex)
	}
	// The hold fields came later still; each is written with its name, so
	// that no two of them (nor TransferIndex) can stand for one another.
	// Events other than holds, posts and voids named no network before networks existed
	// (theirs was their asset's, ETH_MAINNET's), so the default network is
	// written as no network: the same deposit reported before and after
	// is the same content.
	network := c.Network
	if network == DefaultNetwork && c.Type != WithdrawalHold && !c.Type.ResolvesHold() {
		network = ""
	}
	for _, f := range [][2]string{{"hold_id", c.HoldID}, {"network", network}, {"to_address", strings.ToLower(c.ToAddress)}} {
		if f[1] != "" {
			writeField(h, f[0])
			writeField(h, f[1])
		}
	}
	return h.Sum(nil)
}

// CompensationEventID names the event that reverses a reorged deposit.
func CompensationEventID(originalEventID string) string {
	return "reorg:" + originalEventID
}

// ReturnEventIDPrefix starts the id of the credit that gives a
// compensated deposit back when its transfer is on the chain again.
const ReturnEventIDPrefix = "return:"

// ReorgCyclesMax bounds how often one deposit is compensated and given
// back: past it the deposit stays compensated and a human decides.
const ReorgCyclesMax = 8

// ReturnEventID names the credit that gives a compensated deposit back
// after its cycle-th compensation. It names no transaction: the deposit
// keeps its transfer's claim.
func ReturnEventID(cycle int, depositID string) string {
	return ReturnEventIDPrefix + strconv.Itoa(cycle) + ":" + depositID
}

// CycleCompensationEventID names a deposit's cycle-th compensation: the
// first is CompensationEventID's; a later one reverses the credit that
// gave the deposit back before it. Ids settle derives start with reserved
// prefixes, so no two cycles of any deposits share one.
func CycleCompensationEventID(cycle int, depositID string) string {
	if cycle <= 1 {
		return CompensationEventID(depositID)
	}
	return CompensationEventID(ReturnEventID(cycle-1, depositID))
}

// Event is a payment event as the ledger processes it.
type Event struct {
	ID     string
	Type   EventType
	UserID int64
	Asset  string
	Amount decimal.Decimal
	TxHash string
	// TransferIndex is the transfer a deposit claims in its transaction
	// when its sender named one (see Transfer).
	TransferIndex string
	// HoldID, Network and ToAddress: see Content.
	HoldID    string
	Network   string
	ToAddress string
	// Generation counts the times the event was handed to the queue
	// afresh (stale recovery, DLQ replay); a task of an older generation
	// is stale and does nothing.
	Generation int
	TraceID    string
}

// Content is what a redelivery of the event must carry again.
func (e Event) Content() Content {
	return Content{Type: e.Type, UserID: e.UserID, Asset: e.Asset, Amount: e.Amount, TxHash: e.TxHash, TransferIndex: e.TransferIndex,
		HoldID: e.HoldID, Network: e.Network, ToAddress: e.ToAddress}
}

// Key is the event's idempotency key.
func (e Event) Key() string { return IdempotencyKey(e.ID, e.Type) }

// ChainGated reports whether the event waits for the chain before the
// ledger applies it: a credit or a post naming a transaction. A post
// accepted while its hold id named no hold (stored with amount 0) pays
// nothing out to check: the ledger ends it unknown_hold.
func (e Event) ChainGated() bool {
	return e.TxHash != "" && e.Type.ChainGated() && (e.Type != WithdrawalPost || !e.Amount.IsZero())
}

// String names the event in logs and errors, never with its amount.
func (e Event) String() string {
	return fmt.Sprintf("%s/%s", e.ID, e.Type)
}
