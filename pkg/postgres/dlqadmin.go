package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// DLQ listing bounds.
const (
	DeadLetterPageMax     = 500
	DeadLetterPageDefault = 100
)

// DeadLetterView is a DLQ row as operators see it, with its event's
// current status.
type DeadLetterView struct {
	ID          int64
	Letter      payment.DeadLetter
	Resolution  string // "", "replayed", "discarded"
	ResolvedBy  string
	ResolvedAt  *time.Time
	Reason      string
	EventStatus string // "" when no event is stored under the id
}

// Errors of DLQ administration.
var (
	ErrDiscarded = fmt.Errorf("%w: the entry was discarded and cannot be replayed", payment.ErrConflict)
	ErrReplayed  = fmt.Errorf("%w: the entry was replayed and cannot be discarded", payment.ErrConflict)
	ErrNoEvent   = fmt.Errorf("%w: the entry names no stored event; only discarding it is possible", payment.ErrConflict)
	// ErrFailureReplayed: the entry is still open, but the failure it
	// records was replayed through another entry since (a copy drained
	// late): the event runs again, so discarding it would decide nothing.
	ErrFailureReplayed = fmt.Errorf("%w: the failure this entry records was replayed since through another entry; replay it to close it", payment.ErrConflict)
)

func scanDeadLetter(row pgx.CollectableRow) (DeadLetterView, error) {
	var v DeadLetterView
	var source, payload string
	var attempt, generation int32
	err := row.Scan(&v.ID, &v.Letter.EventID, &v.Letter.EventType, &v.Letter.UserID, &v.Letter.Asset, &v.Letter.Amount,
		&v.Letter.Error, &attempt, &generation, &source, &v.Letter.TraceID, &v.Letter.CreatedAt,
		&v.Resolution, &v.ResolvedBy, &v.ResolvedAt, &v.Reason, &v.EventStatus, &payload)
	v.Letter.Attempt, v.Letter.Generation, v.Letter.Source = int(attempt), int(generation), payment.DeadLetterSource(source)
	if amount, parseErr := decimal.NewFromString(v.Letter.Amount); parseErr == nil {
		v.Letter.Amount = amount.String() // "3", not NUMERIC's "3.000000000000000000"
	}
	if payload != "" {
		v.Letter.Payload = []byte(payload)
	}
	return v, err
}

// DeadLetters lists entries by state ("open", "resolved" or "all") after
// id afterID, oldest first.
func (db *DB) DeadLetters(ctx context.Context, state string, afterID int64, limit int) ([]DeadLetterView, error) {
	if state != "open" && state != "resolved" && state != "all" {
		return nil, payment.Invalid("state %q is not open, resolved or all", state)
	}
	if limit <= 0 {
		limit = DeadLetterPageDefault
	}
	limit = min(limit, DeadLetterPageMax)
	stmt := q("dlq_list")
	rows, err := db.pool.Query(ctx, stmt.text, state, afterID, limit)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	return out, classify(stmt.name, err)
}

// DeadLetter reads one entry.
func (db *DB) DeadLetter(ctx context.Context, id int64) (DeadLetterView, error) {
	stmt := q("dlq_get")
	rows, err := db.pool.Query(ctx, stmt.text, id)
	if err != nil {
		return DeadLetterView{}, classify(stmt.name, err)
	}
	v, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetterView{}, fmt.Errorf("dead letter %d: %w", id, payment.ErrNotFound)
	}
	return v, classify(stmt.name, err)
}

// ReplayResult says what a replay did.
type ReplayResult string

const (
	// Reopened: the event went back to the outbox; the ledger will apply
	// it through the normal path (its idempotency key still guards it).
	Reopened ReplayResult = "reopened"
	// AlreadyReplayed: this entry was replayed before; nothing changed.
	AlreadyReplayed ReplayResult = "already_replayed"
	// Superseded: the event is no longer dead-lettered (settled, or back in
	// flight through another entry), or its failure now is of a later
	// generation than the entry's; the entry is closed, nothing else.
	Superseded ReplayResult = "superseded"
)

// ReplayDeadLetter is a human's decision to run a dead-lettered event
// again, recorded with who and why. Replaying twice is a no-op, and a
// replay can never credit twice: the event goes through the ledger, whose
// idempotency key and journal constraint see it once.
func (db *DB) ReplayDeadLetter(ctx context.Context, id int64, who, why string) (ReplayResult, error) {
	if who == "" {
		return "", payment.Invalid("a replay needs the operator's name")
	}
	tx, err := db.begin(ctx)
	if err != nil {
		return "", classify("replay dead letter", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	eventID, resolution, generation, err := lockDeadLetter(ctx, tx, id)
	if err != nil {
		return "", err
	}
	switch resolution {
	case "replayed":
		return AlreadyReplayed, nil
	case "discarded":
		return "", ErrDiscarded
	}
	states, err := eventStates(ctx, tx, []string{eventID})
	if err != nil {
		return "", err
	}
	state := states[eventID]
	if !state.Found {
		return "", ErrNoEvent
	}
	// An entry of an earlier generation is no longer the event's failure
	// (the event went back to the outbox since): it is superseded whatever
	// became of the event, and reopens nothing.
	current := state.Generation == generation
	if current {
		stmt := q("dlq_failure_discarded")
		var discarded bool
		if err := tx.QueryRow(ctx, stmt.text, eventID).Scan(&discarded); err != nil {
			return "", classify(stmt.name, err)
		}
		if discarded {
			return "", ErrDiscarded
		}
	}
	moved, _, err := transition(ctx, tx, q("reopen_for_replay"), nil, nil, eventID, generation)
	if err != nil {
		return "", err
	}
	result := Superseded
	if moved[eventID] {
		result = Reopened
	} else if why == "" {
		why = "event was " + string(state.Status) + " at replay"
		if !current {
			why = fmt.Sprintf("event was %s in generation %d at replay; the entry is of generation %d", state.Status, state.Generation, generation)
		}
	}
	stmt := q("dlq_resolve")
	if _, err := tx.Exec(ctx, stmt.text, id, "replayed", who, why); err != nil {
		return "", classify(stmt.name, err)
	}
	if result == Reopened {
		// The decision is about the failure, as a discard's is: its other
		// open entries close with it, so a discard of one cannot answer
		// "discarded" for an event that runs again.
		stmt = q("dlq_replay_siblings")
		if _, err := tx.Exec(ctx, stmt.text, eventID, generation, who, fmt.Sprintf("replayed through entry %d", id)); err != nil {
			return "", classify(stmt.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", classify("replay dead letter commit", err)
	}
	return result, nil
}

// DiscardDeadLetter closes an entry for good, with every other open entry
// of its event's failure; a reason is required. Discarding twice is a
// no-op; a replayed entry cannot be discarded, and no entry of a failure
// discarded can be replayed.
func (db *DB) DiscardDeadLetter(ctx context.Context, id int64, who, why string) (bool, error) {
	if who == "" || why == "" {
		return false, payment.Invalid("a discard needs the operator's name and a reason")
	}
	tx, err := db.begin(ctx)
	if err != nil {
		return false, classify("discard dead letter", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	eventID, resolution, generation, err := lockDeadLetter(ctx, tx, id)
	if err != nil {
		return false, err
	}
	switch resolution {
	case "discarded":
		return false, nil
	case "replayed":
		return false, ErrReplayed
	}
	states, err := eventStates(ctx, tx, []string{eventID})
	if err != nil {
		return false, err
	}
	if state := states[eventID]; state.Found && state.Generation > generation {
		return false, ErrFailureReplayed
	}
	stmt := q("dlq_resolve")
	if _, err := tx.Exec(ctx, stmt.text, id, "discarded", who, why); err != nil {
		return false, classify(stmt.name, err)
	}
	// The decision is about the event: its other open entries (one per
	// failed attempt, or a copy drained from the fallback list) close
	// with it, or a replay of one would undo it.
	stmt = q("dlq_discard_event")
	if _, err := tx.Exec(ctx, stmt.text, eventID, who, why); err != nil {
		return false, classify(stmt.name, err)
	}
	return true, classify("discard dead letter commit", tx.Commit(ctx))
}

// lockDeadLetter locks an entry's event (when stored), then the entry;
// it returns the entry's event, resolution and generation.
func lockDeadLetter(ctx context.Context, tx pgx.Tx, id int64) (string, string, int, error) {
	notFound := fmt.Errorf("dead letter %d: %w", id, payment.ErrNotFound)
	stmt := q("dlq_event_of")
	var eventID, resolution string
	var generation int32
	err := tx.QueryRow(ctx, stmt.text, id).Scan(&eventID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", 0, notFound
	}
	if err != nil {
		return "", "", 0, classify(stmt.name, err)
	}
	stmt = q("dlq_lock_event")
	if _, err := tx.Exec(ctx, stmt.text, eventID); err != nil {
		return "", "", 0, classify(stmt.name, err)
	}
	stmt = q("dlq_lock")
	err = tx.QueryRow(ctx, stmt.text, id).Scan(&eventID, &resolution, &generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", 0, notFound
	}
	return eventID, resolution, int(generation), classify(stmt.name, err)
}
