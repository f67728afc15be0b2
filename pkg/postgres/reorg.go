package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// Reversal says what ReverseDeposit did.
type Reversal int

const (
	// Voided: the deposit was not credited yet; it ended failed/reorged.
	Voided Reversal = iota + 1
	// Compensating: the deposit was credited; its compensation event
	// (reorg:<id>) is in the outbox, or was already.
	Compensating
	// AlreadyFailed: the deposit had failed before; nothing to reverse.
	AlreadyFailed
)

func (r Reversal) String() string {
	switch r {
	case Voided:
		return "voided"
	case Compensating:
		return "compensating"
	case AlreadyFailed:
		return "already_failed"
	}
	return "unknown"
}

// ReverseDeposit handles a deposit whose transaction is no longer in the
// canonical chain (receipt gone, block hash changed, or the provider's
// removed: true). Uncredited, it fails with outcome reorged. Credited, it
// gets a compensation event that debits it through the normal flow; the
// compensation's id is fixed per cycle (see reorgCycles), so a reorg
// reported twice compensates once.
// The event row is locked first, so a ledger batch crediting it right now
// finishes before this decides.
func (db *DB) ReverseDeposit(ctx context.Context, eventID, reason, traceID string) (Reversal, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return 0, classify("reverse deposit", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	e, status, err := lockDepositEvent(ctx, tx, eventID)
	if err != nil {
		return 0, err
	}
	result, err := reverseLocked(ctx, tx, e, status, reason, traceID)
	if err != nil || result == AlreadyFailed {
		return result, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, classify("reverse deposit commit", err)
	}
	return result, nil
}

// lockDepositEvent locks a deposit's row (lock_event): payment.ErrNotFound
// when there is none, payment.ErrInvalid when the event is no credit.
func lockDepositEvent(ctx context.Context, tx pgx.Tx, eventID string) (payment.Event, payment.Status, error) {
	stmt := q("lock_event")
	var e payment.Event
	var eventType, amount, status string
	var generation int32
	err := tx.QueryRow(ctx, stmt.text, eventID).Scan(&e.ID, &eventType, &e.UserID, &e.Asset, &amount, &status, &e.TxHash, &e.TraceID, &generation, &e.Network)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, "", fmt.Errorf("deposit %s: %w", eventID, payment.ErrNotFound)
	}
	if err != nil {
		return e, "", classify(stmt.name, err)
	}
	e.Type, e.Amount = payment.EventType(eventType), decimal.RequireFromString(amount)
	if !e.Type.Credit() {
		return e, "", payment.Invalid("event %s is a %s, not a deposit", eventID, e.Type)
	}
	return e, payment.Status(status), nil
}

// reverseLocked is ReverseDeposit for a deposit whose row the caller
// locked, inside the caller's transaction.
func reverseLocked(ctx context.Context, tx pgx.Tx, e payment.Event, status payment.Status, reason, traceID string) (Reversal, error) {
	if traceID == "" {
		traceID = e.TraceID
	}
	switch status {
	case payment.StatusFailed:
		return AlreadyFailed, nil
	case payment.StatusConfirmed:
		return Compensating, reverseCredited(ctx, tx, e, reason, traceID)
	default:
		return Voided, voidUncredited(ctx, tx, e, status, reason)
	}
}

// voidUncredited fails a deposit (or give-back) not credited yet with
// outcome reorged; the caller holds its row lock.
func voidUncredited(ctx context.Context, tx pgx.Tx, e payment.Event, status payment.Status, reason string) error {
	_, refused, err := transition(ctx, tx, q("void_uncredited"), []string{e.ID}, nil, e.ID, reason)
	if err != nil {
		return err
	}
	if r, ok := refused[e.ID]; ok {
		return r.Err(e.ID, []payment.Status{status}, payment.StatusFailed)
	}
	stmt := q("record_outcome")
	_, err = tx.Exec(ctx, stmt.text, e.Key(), e.ID, string(payment.OutcomeReorged))
	return classify(stmt.name, err)
}
