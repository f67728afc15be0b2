package payment

// Status is where an event stands. The transition table below is the only
// source of truth for the allowed moves; migration 0001's trigger mirrors
// it in PostgreSQL, and a test proves the two agree edge by edge.
type Status string

const (
	StatusPending  Status = "pending"
	StatusEnqueued Status = "enqueued"
	// StatusProcessing is the seed's "being applied". settle's ledger locks
	// the event and moves it from enqueued to its terminal status in one
	// transaction, so an intermediate processing write would be seen by
	// nobody and cost a row version per event; it is not made. The state
	// stays in the contract and the table, and the zombie check still
	// watches it, for tools that mark work in flight.
	StatusProcessing Status = "processing"
	// StatusAwaitingFinality is a deposit whose transaction has not yet
	// reached the finality policy; it is re-checked on a schedule and does
	// not burn its retry budget while it waits.
	StatusAwaitingFinality Status = "awaiting_finality"
	StatusConfirmed        Status = "confirmed"
	StatusFailed           Status = "failed"
)

// Statuses lists every status in a fixed order.
var Statuses = []Status{StatusPending, StatusEnqueued, StatusProcessing, StatusAwaitingFinality, StatusConfirmed, StatusFailed}

// transitions is the table of allowed moves.
//
//	pending           → enqueued (outbox claim), failed (reorg before enqueue)
//	enqueued          → processing (ledger claim), pending (stale recovery),
//	                    awaiting_finality (not final yet), failed, confirmed (replay)
//	processing        → confirmed, failed
//	awaiting_finality → enqueued (re-check due), failed (reorged / timed out)
//	failed            → pending (a human replays its DLQ entry)
var transitions = map[Status][]Status{
	StatusPending:          {StatusEnqueued, StatusFailed},
	StatusEnqueued:         {StatusProcessing, StatusFailed, StatusPending, StatusConfirmed, StatusAwaitingFinality},
	StatusProcessing:       {StatusConfirmed, StatusFailed},
	StatusAwaitingFinality: {StatusEnqueued, StatusFailed},
	StatusFailed:           {StatusPending},
}

// CanTransition reports whether from → to is an allowed edge.
func CanTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether the ledger is done with the event. A failed
// event may still be reopened, but only by a human replaying its DLQ entry.
func (s Status) Terminal() bool { return s == StatusConfirmed || s == StatusFailed }

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	for _, k := range Statuses {
		if k == s {
			return true
		}
	}
	return false
}
