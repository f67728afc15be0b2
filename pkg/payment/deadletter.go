package payment

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// DeadLetterSource says which part of settle gave up on an event.
type DeadLetterSource string

const (
	SourceWorker   DeadLetterSource = "worker"   // the task failed for good
	SourceRecovery DeadLetterSource = "recovery" // stale recovery ran out of attempts
	SourceLedger   DeadLetterSource = "ledger"   // the ledger could not apply it
	SourceChain    DeadLetterSource = "chain"    // the chain path could not decide it
	SourceDrain    DeadLetterSource = "drain"    // came back from the Redis fallback
)

// DeadLetter is one failed attempt, as written to dead_letter_queue, or to
// the Redis fallback list (as JSON) when PostgreSQL is unreachable.
type DeadLetter struct {
	EventID    string           `json:"event_id"`
	EventType  string           `json:"event_type"`
	UserID     int64            `json:"user_id,omitempty"`
	Asset      string           `json:"asset,omitempty"`
	Amount     string           `json:"amount,omitempty"`
	Error      string           `json:"error"`
	Attempt    int              `json:"attempt"`
	Generation int              `json:"generation"`
	Source     DeadLetterSource `json:"source"`
	TraceID    string           `json:"trace_id,omitempty"`
	Payload    json.RawMessage  `json:"payload,omitempty"`
	CreatedAt  time.Time        `json:"created_at"`
	// FallbackID makes writing an entry idempotent: one parked in Redis
	// while PostgreSQL was unreachable gets one, so its drain cannot
	// write it twice; a writer that may repeat itself sets its own.
	FallbackID string `json:"fallback_id,omitempty"`
	// FailEvent says the writer meant to fail the event too; the drain
	// does so if the event is still where the writer left it.
	FailEvent bool `json:"fail_event,omitempty"`
}

// FailureKey is the idempotency key (FallbackID) of the row recording an
// event's failure in one generation: a generation fails at most once, so
// a write repeated after an ambiguous commit, or its copy parked in Redis
// and drained later, finds the row already there.
func FailureKey(eventID string, generation int) string {
	return "fail:" + eventID + ":g" + strconv.Itoa(generation)
}

// OperatorLengthMax and ReasonLengthMax bound the name and the reason an
// operator's action records (a replay, discard, redelivery, recheck or
// rescan), in characters: the admin API, the console and settlectl all
// refuse longer ones, so each surface records the same.
const (
	OperatorLengthMax = 200
	ReasonLengthMax   = 1000
)

// NoteFits says whether an operator's reason fits its bound: valid UTF-8
// of at most max characters, counted in characters on every surface, so
// none takes what another refuses, and no control character but line
// breaks and tabs (a reason may span lines; an escape sequence would
// reach the terminal of whoever lists it).
func NoteFits(s string, max int) bool {
	return utf8.ValidString(s) && utf8.RuneCountInString(s) <= max && !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t'
	})
}

// NameFits says whether an operator's name fits its bound: as NoteFits,
// on one line with no control character at all.
func NameFits(s string, max int) bool {
	return NoteFits(s, max) && !strings.ContainsFunc(s, unicode.IsControl)
}
