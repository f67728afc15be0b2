package postgres

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// eventIDLengthMax is payment_events.event_id's bound, in characters.
const eventIDLengthMax = 256

// Return says what ReturnDeposit did.
type Return int

const (
	// NotCompensated: the deposit is not a compensated credit (not
	// credited, never reorged, or already given back); nothing changed.
	NotCompensated Return = iota
	// GivenBack: a credit giving the deposit back is in the outbox.
	GivenBack
	// WatchedAgain: the deposit is watched again and is given back once
	// the chain shows its transfer finalized.
	WatchedAgain
	// CyclesExhausted: the deposit was compensated and given back as often
	// as settle allows; it stays compensated for a human to decide.
	CyclesExhausted
)

func (r Return) String() string {
	switch r {
	case NotCompensated:
		return "not_compensated"
	case GivenBack:
		return "given_back"
	case WatchedAgain:
		return "watched_again"
	case CyclesExhausted:
		return "cycles_exhausted"
	}
	return "unknown"
}

// credited is a deposit locked by lock_credited.
type credited struct {
	payment.Event
	Status     payment.Status
	ChainState string
}

func lockCredited(ctx context.Context, tx pgx.Tx, eventID string) (credited, error) {
	return lockDeposit(ctx, tx, q("lock_credited"), eventID)
}

// lockDeposit runs the locking read stmt: payment.ErrNotFound when it
// finds no row.
func lockDeposit(ctx context.Context, tx pgx.Tx, stmt query, eventID string) (credited, error) {
	c := credited{Event: payment.Event{ID: eventID}}
	var eventType, amount, status string
	err := tx.QueryRow(ctx, stmt.text, eventID).Scan(&eventType, &c.UserID, &c.Asset, &amount, &status, &c.TxHash, &c.TraceID, &c.Network, &c.ChainState)
	if errors.Is(err, pgx.ErrNoRows) {
		return credited{}, fmt.Errorf("deposit %s: %w", eventID, payment.ErrNotFound)
	}
	if err != nil {
		return credited{}, classify(stmt.name, err)
	}
	c.Type, c.Amount, c.Status = payment.EventType(eventType), decimal.RequireFromString(amount), payment.Status(status)
	return c, nil
}

// reorgCycles counts a deposit's compensations and the credits that gave
// it back. Each is created after the one before (compensation n, then
// give-back n), so the deposit is off the chain exactly when there is one
// more compensation than give-backs. The caller holds the deposit's lock.
func reorgCycles(ctx context.Context, tx pgx.Tx, depositID string) (compensations, givenBack int, err error) {
	ids := make([]string, 0, 2*payment.ReorgCyclesMax)
	kind := map[string]bool{} // true: a compensation
	for n := 1; n <= payment.ReorgCyclesMax; n++ {
		c, r := payment.CycleCompensationEventID(n, depositID), payment.ReturnEventID(n, depositID)
		ids = append(ids, c, r)
		kind[c] = true
	}
	stmt := q("reorg_cycle_events")
	rows, err := tx.Query(ctx, stmt.text, ids)
	if err != nil {
		return 0, 0, classify(stmt.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, 0, classify(stmt.name, err)
		}
		if kind[id] {
			compensations++
		} else {
			givenBack++
		}
	}
	return compensations, givenBack, classify(stmt.name, rows.Err())
}

// canGiveBack tells whether the cycle-th compensation of a deposit may be
// reversed: only while a later reorg could still compensate it again
// (within ReorgCyclesMax, and with an id that fits the column), so that
// nothing is ever given back that could not be taken again.
func canGiveBack(cycle int, depositID string) bool {
	return cycle < payment.ReorgCyclesMax &&
		utf8.RuneCountInString(payment.CycleCompensationEventID(cycle+1, depositID)) <= eventIDLengthMax
}

// ReturnDeposit handles a credited deposit that was compensated for a
// reorg and whose transfer is reported on the chain again. Where the
// provider's word is the evidence (watch false: no RPC for the network),
// a credit giving the deposit back enters the outbox now. Where the chain
// can be asked (watch true), the deposit is watched again and given back
// once the watcher sees its transfer finalized (MarkFinal, MoveEvidence).
// Any other deposit, or none, is left as it is (NotCompensated).
func (db *DB) ReturnDeposit(ctx context.Context, eventID string, watch bool, reason string) (Return, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return 0, classify("return deposit", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	r, err := returnDeposit(ctx, tx, eventID, watch, reason)
	if err != nil || r == NotCompensated || r == CyclesExhausted {
		return r, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, classify("return deposit commit", err)
	}
	return r, nil
}

// returnDeposit is ReturnDeposit inside the caller's transaction.
func returnDeposit(ctx context.Context, tx pgx.Tx, eventID string, watch bool, reason string) (Return, error) {
	c, err := lockDeposit(ctx, tx, q("lock_compensated"), eventID)
	if errors.Is(err, payment.ErrNotFound) {
		return NotCompensated, nil
	}
	if err != nil {
		return 0, err
	}
	if !c.Type.Credit() || c.TxHash == "" || c.Status != payment.StatusConfirmed || c.ChainState != "reorged" {
		return NotCompensated, nil
	}
	comps, back, err := reorgCycles(ctx, tx, eventID)
	if err != nil {
		return 0, err
	}
	if comps <= back {
		return NotCompensated, nil
	}
	if !canGiveBack(comps, eventID) {
		return CyclesExhausted, nil
	}
	if watch {
		stmt := q("watch_returned")
		_, err := tx.Exec(ctx, stmt.text, eventID, reason)
		return WatchedAgain, classify(stmt.name, err)
	}
	return GivenBack, giveBack(ctx, tx, c, comps, "", reason)
}

// giveBackIfCompensated gives back a deposit the watcher just saw
// finalized if it is off the chain in settle's books (a compensated
// deposit watched again); a deposit never compensated is left as it is.
// The caller's UPDATE holds the deposit's lock.
func giveBackIfCompensated(ctx context.Context, tx pgx.Tx, eventID string) (bool, error) {
	c, err := lockCredited(ctx, tx, eventID)
	if err != nil {
		return false, err
	}
	if !c.Type.Credit() || c.Status != payment.StatusConfirmed {
		return false, nil
	}
	comps, back, err := reorgCycles(ctx, tx, eventID)
	if err != nil || comps <= back {
		return false, err
	}
	return true, giveBack(ctx, tx, c, comps, "final", "the transfer is finalized on the chain again")
}

// giveBack enters the credit that reverses the deposit's cycle-th
// compensation, and marks the deposit on the chain again (chainState).
func giveBack(ctx context.Context, tx pgx.Tx, c credited, cycle int, chainState, reason string) error {
	credit := NewEvent{
		Event: payment.Event{
			ID: payment.ReturnEventID(cycle, c.ID), Type: payment.Deposit,
			UserID: c.UserID, Asset: c.Asset, Amount: c.Amount, TraceID: c.TraceID, Network: c.Network,
		},
		Source:  SourceReorg,
		Related: c.ID,
	}
	if _, err := insertEvent(ctx, tx, credit); err != nil {
		return err
	}
	stmt := q("mark_given_back")
	var state any
	if chainState != "" {
		state = chainState
	}
	_, err := tx.Exec(ctx, stmt.text, c.ID, state, reason)
	return classify(stmt.name, err)
}
