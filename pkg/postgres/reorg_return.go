package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// lockClaimHolder locks the credited, compensated deposit holding the
// claim on transfer t; payment.ErrNotFound when there is none.
func lockClaimHolder(ctx context.Context, tx pgx.Tx, t payment.Transfer) (credited, error) {
	stmt := q("lock_compensated_claim")
	c, err := scanHolder(tx.QueryRow(ctx, stmt.text, t.Network, strings.ToLower(t.TxHash), strings.ToLower(t.Index)))
	if errors.Is(err, pgx.ErrNoRows) {
		return credited{}, fmt.Errorf("transfer %s %s %s: %w", t.Network, t.TxHash, t.Index, payment.ErrNotFound)
	}
	if err != nil {
		return credited{}, classify(stmt.name, err)
	}
	return c, nil
}

// scanHolder reads a claim holder's row (lock_compensated_claim's
// columns).
func scanHolder(row pgx.Row) (credited, error) {
	var c credited
	var eventType, amount, status string
	if err := row.Scan(&c.ID, &eventType, &c.UserID, &c.Asset, &amount, &status, &c.TxHash, &c.TraceID, &c.Network, &c.ChainState); err != nil {
		return credited{}, err
	}
	c.Type, c.Amount, c.Status = payment.EventType(eventType), decimal.RequireFromString(amount), payment.Status(status)
	return c, nil
}

// reorgCycle is where a credited deposit stands in its reorgs: each
// compensation n reverses it (the first) or the give-back n-1 before it,
// and give-back n reverses compensation n. They are created in that order.
type reorgCycle struct {
	// compensations counts the compensations created, applied or not.
	compensations int
	// cancelled: the last compensation was never applied and its transfer
	// came back first (failed, outcome reorged); see cancelCompensation.
	cancelled bool
	// back is the status of the give-back of the last compensation; ""
	// when there is none.
	back payment.Status
	// backDead: that give-back was dead-lettered. It still stands (its
	// credit waits for a replay), unlike one voided.
	backDead bool
}

// onChain tells whether the deposit counts as on the chain in the books:
// never compensated, its last compensation cancelled, or given back (a
// give-back voided before it was credited does not count; one
// dead-lettered does).
func (c reorgCycle) onChain() bool {
	return c.compensations == 0 || c.cancelled || c.back != "" && (c.back != payment.StatusFailed || c.backDead)
}

// readReorgCycle reads a deposit's compensations and give-backs; the
// caller holds the deposit's lock, so no other is created meanwhile.
func readReorgCycle(ctx context.Context, tx pgx.Tx, depositID string) (reorgCycle, error) {
	ids := make([]string, 0, 2*payment.ReorgCyclesMax)
	compensation := map[string]bool{}
	for n := 1; n <= payment.ReorgCyclesMax; n++ {
		c := payment.CycleCompensationEventID(n, depositID)
		ids = append(ids, c, payment.ReturnEventID(n, depositID))
		compensation[c] = true
	}
	stmt := q("reorg_cycle_events")
	rows, err := tx.Query(ctx, stmt.text, ids)
	if err != nil {
		return reorgCycle{}, classify(stmt.name, err)
	}
	defer rows.Close()
	backs := map[string]payment.Status{}
	cancelled, dead := map[string]bool{}, map[string]bool{}
	var c reorgCycle
	for rows.Next() {
		var id, status, outcome string
		if err := rows.Scan(&id, &status, &outcome); err != nil {
			return reorgCycle{}, classify(stmt.name, err)
		}
		if compensation[id] {
			c.compensations++
			cancelled[id] = payment.Status(status) == payment.StatusFailed && payment.Outcome(outcome) == payment.OutcomeReorged
		} else {
			backs[id] = payment.Status(status)
			dead[id] = payment.Status(status) == payment.StatusFailed && payment.Outcome(outcome) == payment.OutcomeDeadLettered
		}
	}
	if err := rows.Err(); err != nil {
		return reorgCycle{}, classify(stmt.name, err)
	}
	if c.compensations > 0 {
		c.cancelled = cancelled[payment.CycleCompensationEventID(c.compensations, depositID)]
		back := payment.ReturnEventID(c.compensations, depositID)
		c.back, c.backDead = backs[back], dead[back]
	}
	return c, nil
}

// reverseCredited handles a credited deposit whose transaction left the
// chain; the caller holds its lock. On the chain in the books, it gets
// its next compensation, or, when it is on the chain through a give-back
// not credited yet, that give-back is voided instead: a compensation is
// created only once what it reverses has been credited, so it can never
// be applied before it. Already off the chain, nothing more is taken.
func reverseCredited(ctx context.Context, tx pgx.Tx, e payment.Event, reason, traceID string) error {
	c, err := readReorgCycle(ctx, tx, e.ID)
	if err != nil {
		return err
	}
	compensate := func(id string) error {
		compensation := NewEvent{
			Event: payment.Event{
				ID: payment.CompensationEventID(id), Type: payment.ReorgCompensation,
				UserID: e.UserID, Asset: e.Asset, Amount: e.Amount, TxHash: e.TxHash, TraceID: traceID, Network: e.Network,
			},
			Source:  SourceReorg,
			Related: e.ID,
		}
		if _, err := insertEvent(ctx, tx, compensation); err != nil && !errors.Is(err, payment.ErrConflict) {
			return err
		}
		return nil
	}
	switch {
	case !c.onChain():
	case c.compensations == 0:
		if err := compensate(e.ID); err != nil {
			return err
		}
	case c.cancelled:
		// Its transfer came back before the compensation was applied,
		// and has left again: the same compensation runs after all.
		if err := reopenCompensation(ctx, tx, payment.CycleCompensationEventID(c.compensations, e.ID), reason); err != nil {
			return err
		}
	default:
		backID := payment.ReturnEventID(c.compensations, e.ID)
		back, err := lockCredited(ctx, tx, backID)
		if err != nil {
			return err
		}
		switch back.Status {
		case payment.StatusConfirmed:
			err = compensate(backID)
		case payment.StatusFailed:
			// Dead-lettered (or voided meanwhile): a replay must not
			// credit a transfer off the chain.
			_, err = cancelDeadLettered(ctx, tx, backID, payment.Deposit, "the deposit's transfer left the chain again", reason)
		default:
			err = voidUncredited(ctx, tx, back.Event, back.Status, reason)
		}
		if err != nil {
			return err
		}
	}
	stmt := q("mark_reorged")
	_, err = tx.Exec(ctx, stmt.text, e.ID, reason)
	return classify(stmt.name, err)
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
// reorg and whose transfer is reported on the chain again: the event
// eventID, or else the deposit holding the claim on transfer t (one
// /webhook/payments named, reported now under the transfer's own id).
// Where the provider's word is the evidence (watch false: no RPC for the
// network), a credit giving the deposit back enters the outbox now. Where
// the chain can be asked (watch true), the deposit is watched again and
// given back once the watcher sees its transfer finalized (MarkFinal,
// MoveEvidence). Any other deposit, or none, is left as it is
// (NotCompensated).
func (db *DB) ReturnDeposit(ctx context.Context, eventID string, t payment.Transfer, watch bool, reason string) (Return, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return 0, classify("return deposit", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	r, err := returnDeposit(ctx, tx, eventID, t, watch, reason)
	if err != nil || r == NotCompensated || r == CyclesExhausted {
		return r, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, classify("return deposit commit", err)
	}
	return r, nil
}

// returnDeposit is ReturnDeposit inside the caller's transaction.
func returnDeposit(ctx context.Context, tx pgx.Tx, eventID string, t payment.Transfer, watch bool, reason string) (Return, error) {
	d, err := lockDeposit(ctx, tx, q("lock_compensated"), eventID)
	if errors.Is(err, payment.ErrNotFound) && t.TxHash != "" && t.Index != "" {
		if watch {
			return returnTransactionHolders(ctx, tx, t, reason)
		}
		d, err = lockClaimHolder(ctx, tx, t)
	}
	if errors.Is(err, payment.ErrNotFound) {
		return NotCompensated, nil
	}
	if err != nil {
		return 0, err
	}
	return returnLocked(ctx, tx, d, watch, reason)
}

// returnLocked is returnDeposit for a deposit the caller locked.
func returnLocked(ctx context.Context, tx pgx.Tx, d credited, watch bool, reason string) (Return, error) {
	if !d.Type.Credit() || d.TxHash == "" || d.Status != payment.StatusConfirmed || d.ChainState != "reorged" {
		return NotCompensated, nil
	}
	c, err := readReorgCycle(ctx, tx, d.ID)
	if err != nil || c.onChain() {
		return NotCompensated, err
	}
	if !canGiveBack(c.compensations, d.ID) {
		return CyclesExhausted, nil
	}
	if watch {
		stmt := q("watch_returned")
		_, err := tx.Exec(ctx, stmt.text, d.ID, reason)
		return WatchedAgain, classify(stmt.name, err)
	}
	return GivenBack, giveBack(ctx, tx, d, c, "", reason)
}

// ReturnHoldersMax bounds the compensated deposits of one transaction
// that one report watches again; a later report takes the next ones (those
// watched already are no longer compensated).
const ReturnHoldersMax = 1000

// returnTransactionHolders watches again every compensated deposit that
// holds a claim on t's transaction, where the chain decides (watch), not
// only the one whose claim names t's index: a log index counts within its
// block, so a transaction mined again in another block reports its
// Transfer under another index than the one claimed. The watcher then
// checks each deposit against the transaction's receipt now, and gives
// back only one it still pays, once final. Where the report is the
// evidence (no watch) only the exact claim is trusted.
func returnTransactionHolders(ctx context.Context, tx pgx.Tx, t payment.Transfer, reason string) (Return, error) {
	stmt := q("lock_compensated_claims_of_tx")
	rows, err := tx.Query(ctx, stmt.text, t.Network, strings.ToLower(t.TxHash), ReturnHoldersMax)
	if err != nil {
		return 0, classify(stmt.name, err)
	}
	holders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (credited, error) { return scanHolder(row) })
	if err != nil {
		return 0, classify(stmt.name, err)
	}
	result := NotCompensated
	for _, d := range holders {
		r, err := returnLocked(ctx, tx, d, true, reason)
		switch {
		case err != nil:
			return 0, err
		case r == WatchedAgain:
			result = WatchedAgain
		case r == CyclesExhausted && result == NotCompensated:
			result = CyclesExhausted
		}
	}
	return result, nil
}

// giveBackIfCompensated gives back a deposit the watcher just saw
// finalized if it is off the chain in settle's books (a compensated
// deposit watched again); a deposit never compensated is left as it is.
// The caller's UPDATE holds the deposit's lock.
func giveBackIfCompensated(ctx context.Context, tx pgx.Tx, eventID string) (bool, error) {
	d, err := lockCredited(ctx, tx, eventID)
	if err != nil {
		return false, err
	}
	if !d.Type.Credit() || d.Status != payment.StatusConfirmed {
		return false, nil
	}
	c, err := readReorgCycle(ctx, tx, eventID)
	if err != nil || c.onChain() || !canGiveBack(c.compensations, eventID) {
		return false, err
	}
	return true, giveBack(ctx, tx, d, c, "final", "the transfer is finalized on the chain again")
}

// giveBack reverses the deposit's last compensation with a credit (a
// give-back voided before, reopened), and marks the deposit on the chain
// again (chainState). A compensation that was never applied is cancelled
// instead (cancelCompensation): a credit would give back what was never
// taken.
func giveBack(ctx context.Context, tx pgx.Tx, d credited, c reorgCycle, chainState, reason string) error {
	id := payment.ReturnEventID(c.compensations, d.ID)
	applied, err := cancelCompensation(ctx, tx, payment.CycleCompensationEventID(c.compensations, d.ID), reason)
	switch {
	case err != nil:
		return err
	case !applied:
	case c.back == payment.StatusFailed:
		if err := reopenVoided(ctx, tx, q("reopen_give_back"), id, payment.Deposit, reason); err != nil {
			return err
		}
	default:
		credit := NewEvent{
			Event: payment.Event{
				ID: id, Type: payment.Deposit,
				UserID: d.UserID, Asset: d.Asset, Amount: d.Amount, TraceID: d.TraceID, Network: d.Network,
			},
			Source:  SourceReorg,
			Related: d.ID,
		}
		if _, err := insertEvent(ctx, tx, credit); err != nil {
			return err
		}
	}
	stmt := q("mark_given_back")
	var state any
	if chainState != "" {
		state = chainState
	}
	_, err = tx.Exec(ctx, stmt.text, d.ID, state, reason)
	return classify(stmt.name, err)
}

// errCompensationInFlight: a compensation is being applied right now; the
// caller asks again later, when it has ended one way or the other.
var errCompensationInFlight = fmt.Errorf("%w: the reorg compensation is being applied; ask again", payment.ErrUnavailable)

// cancelCompensation settles a deposit's compensation (id) whose transfer
// is on the chain again. Applied (confirmed), it is left alone and
// applied is true: a give-back credit reverses it. Not applied yet, it is
// cancelled, failed with outcome reorged: one in the outbox is voided, and
// one that was dead-lettered (the user's available balance did not cover
// it) has its dead letters discarded, so a replay cannot take back a
// deposit that is on the chain. The caller holds the deposit's lock; the
// compensation's is taken here, after any ledger batch applying it.
func cancelCompensation(ctx context.Context, tx pgx.Tx, id, reason string) (applied bool, err error) {
	comp, err := lockCredited(ctx, tx, id)
	if err != nil {
		return false, err
	}
	switch comp.Status {
	case payment.StatusConfirmed:
		return true, nil
	case payment.StatusProcessing:
		return false, errCompensationInFlight
	case payment.StatusFailed:
		_, err := cancelDeadLettered(ctx, tx, id, payment.ReorgCompensation, "the deposit's transfer is on the chain again", reason)
		return false, err
	default:
		return false, voidUncredited(ctx, tx, comp.Event, comp.Status, reason)
	}
}

// cancelDeadLettered ends a reorg event (a compensation, a give-back) that
// the ledger dead-lettered and the chain has since made moot: failed with
// outcome reorged, which no replay reopens, its dead letters discarded by
// settle saying why. False when it was not dead-lettered (cancelled or
// voided before). The caller holds the event's row lock.
func cancelDeadLettered(ctx context.Context, tx pgx.Tx, id string, kind payment.EventType, why, reason string) (bool, error) {
	stmt := q("cancel_dead_lettered")
	tag, err := tx.Exec(ctx, stmt.text, id, reason)
	if err != nil {
		return false, classify(stmt.name, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	stmt = q("dlq_discard_event")
	if _, err := tx.Exec(ctx, stmt.text, id, "settle", why+": "+reason); err != nil {
		return false, classify(stmt.name, err)
	}
	stmt = q("record_outcome")
	_, err = tx.Exec(ctx, stmt.text, payment.IdempotencyKey(id, kind), id, string(payment.OutcomeReorged))
	return true, classify(stmt.name, err)
}

// reopenCompensation sends a cancelled compensation back to the outbox.
func reopenCompensation(ctx context.Context, tx pgx.Tx, id, reason string) error {
	return reopenVoided(ctx, tx, q("reopen_compensation"), id, payment.ReorgCompensation, reason)
}

// reopenVoided sends a reorg event that ended failed/reorged before it
// was applied (a give-back, a compensation) back to the outbox through
// stmt: the same id, a new generation, a first attempt for the ledger.
func reopenVoided(ctx context.Context, tx pgx.Tx, stmt query, id string, kind payment.EventType, reason string) error {
	_, refused, err := transition(ctx, tx, stmt, []string{id}, nil, id, reason)
	if err != nil {
		return err
	}
	if r, ok := refused[id]; ok {
		return r.Err(id, []payment.Status{payment.StatusFailed}, payment.StatusPending)
	}
	outcome := q("reopen_outcome")
	_, err = tx.Exec(ctx, outcome.text, payment.IdempotencyKey(id, kind), id)
	return classify(outcome.name, err)
}
