package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// ReopenDeposit sends a failed deposit back to the outbox when the chain
// (or its provider) shows its transaction again: a deposit with a tx_hash
// that ended failed with one of outcomes goes back to pending under a new
// generation, its chain history forgotten and its finality clock
// restarted, and its idempotency record says reopened so the ledger runs
// it as a first attempt (and credits it only through the finality gate
// and its transfer claim). It reports false, changing nothing, for a
// deposit in any other state (already reopened, pending, confirmed, or
// failed otherwise); payment.ErrNotFound when there is no such event.
func (db *DB) ReopenDeposit(ctx context.Context, eventID string, outcomes []payment.Outcome, reason string) (bool, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return false, classify("reopen deposit", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	reopened, err := reopenDeposit(ctx, tx, eventID, outcomes, reason)
	if err != nil || !reopened {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, classify("reopen deposit commit", err)
	}
	return true, nil
}

// reopenDeposit is ReopenDeposit inside the caller's transaction.
func reopenDeposit(ctx context.Context, tx pgx.Tx, eventID string, outcomes []payment.Outcome, reason string) (bool, error) {
	names := make([]string, len(outcomes))
	for i, o := range outcomes {
		names[i] = string(o)
	}
	var eventType string
	moved, refused, err := transition(ctx, tx, q("reopen_deposit"), []string{eventID}, func(rows pgx.Rows) (string, error) {
		var id string
		return id, rows.Scan(&id, &eventType)
	}, eventID, names, reason)
	if err != nil {
		return false, err
	}
	if r, ok := refused[eventID]; ok {
		if !r.Found {
			return false, fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
		}
		return false, nil
	}
	if !moved[eventID] {
		return false, nil
	}
	stmt := q("reopen_outcome")
	if _, err := tx.Exec(ctx, stmt.text, payment.IdempotencyKey(eventID, payment.EventType(eventType)), eventID); err != nil {
		return false, classify(stmt.name, err)
	}
	return true, nil
}

// Hurry says what HurryFinalityCheck found.
type Hurry struct {
	Type   payment.EventType
	Status payment.Status
	// ChainState is "watching" for a deposit credited before finality,
	// "final" once its block is, "" when never credited under watch.
	ChainState string
	// Hurried: the deposit waited for finality and is now due.
	Hurried bool
}

// HurryFinalityCheck makes a deposit that waits for finality due at once
// (and wakes the enqueuer), so the chain is asked about it now; a deposit
// in any other state is left as it is. It answers the event's state;
// payment.ErrNotFound when there is no such event.
func (db *DB) HurryFinalityCheck(ctx context.Context, eventID string) (Hurry, error) {
	stmt := q("hurry_finality_check")
	var h Hurry
	var eventType, status string
	var woken int64
	err := db.pool.QueryRow(ctx, stmt.text, eventID).Scan(&eventType, &status, &h.ChainState, &h.Hurried, &woken)
	if errors.Is(err, pgx.ErrNoRows) {
		return Hurry{}, fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
	}
	h.Type, h.Status = payment.EventType(eventType), payment.Status(status)
	return h, classify(stmt.name, err)
}
