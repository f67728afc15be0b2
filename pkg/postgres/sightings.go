package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// Sighting is one provider report of a transfer that names the block it
// saw the transfer in, on a network settle cannot ask: the report is the
// evidence.
type Sighting struct {
	Transfer payment.Transfer
	// BlockHash is the block the provider saw the transfer in, 0x and 64
	// lowercase hex digits.
	BlockHash string
	// Removed: the provider reports the block's transfer taken away by a
	// reorg.
	Removed  bool
	Reporter string
	Reason   string
	TraceID  string
}

// Sighted says what SightTransfer found and did.
type Sighted struct {
	// Known: the transfer's deposit exists.
	Known bool
	// OnChain: some block the transfer was reported in is not reported
	// removed.
	OnChain bool
	// Reversal is set when the deposit is off the chain: what reversing it
	// did (AlreadyFailed when it had failed before).
	Reversal Reversal
	// Reopened: on the chain again, the deposit that had failed reorged
	// went back to pending.
	Reopened bool
	// Return: on the chain again, whether a compensated credit was given
	// back (the deposit, or the one holding the transfer's claim).
	Return Return
}

// SightTransfer records a report of a transfer in a block and brings the
// transfer's deposit (event id Transfer.EventID()) in line with all the
// reports so far, in one transaction: a block once reported removed stays
// removed, and the transfer is on the chain while some block it was
// reported in is not. Off the chain, the deposit is reversed as by
// ReverseDeposit; on it, a deposit that failed reorged is reopened and a
// compensated one given back (ReturnDeposit without a watch). So the
// order the reports arrive in does not matter: a removal delivered after
// the transfer's re-add in another block reverses nothing, and an add
// delivered again after its block's removal credits nothing.
//
// The sighting is written before the deposit's row is locked, and every
// report locks that row before it decides: the last report to decide
// sees every sighting written before it, so racing reports end where
// their order would have.
func (db *DB) SightTransfer(ctx context.Context, s Sighting) (Sighted, error) {
	var out Sighted
	eventID := s.Transfer.EventID()
	tx, err := db.begin(ctx)
	if err != nil {
		return out, classify("sight transfer", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("sight_transfer")
	if _, err := tx.Exec(ctx, stmt.text, eventID, s.BlockHash, s.Removed, s.Reporter); err != nil {
		return out, classify(stmt.name, err)
	}
	e, status, err := lockDepositEvent(ctx, tx, eventID)
	switch {
	case errors.Is(err, payment.ErrNotFound):
		// A removal before the transfer's first report: kept, so that
		// report finds its block removed.
		err = nil
	case err != nil:
		return out, err
	default:
		out.Known = true
	}
	stmt = q("sighted_on_chain")
	if err := tx.QueryRow(ctx, stmt.text, eventID).Scan(&out.OnChain); err != nil {
		return out, classify(stmt.name, err)
	}
	switch {
	case !out.Known:
	case !out.OnChain:
		out.Reversal, err = reverseLocked(ctx, tx, e, status, s.Reason, s.TraceID)
	case status == payment.StatusFailed:
		out.Reopened, err = reopenDeposit(ctx, tx, eventID, []payment.Outcome{payment.OutcomeReorged}, s.Reason)
	default:
		out.Return, err = returnDeposit(ctx, tx, eventID, s.Transfer, false, s.Reason)
	}
	if err != nil {
		return Sighted{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Sighted{}, classify("sight transfer commit", err)
	}
	return out, nil
}

// TransferSighting is one block a transfer was reported in.
type TransferSighting struct {
	BlockHash string
	Removed   bool
	Reporter  string
	FirstAt   time.Time
	RemovedAt *time.Time
}

// EventSightings lists the blocks an event's transfer was reported in,
// first first.
func (db *DB) EventSightings(ctx context.Context, eventID string) ([]TransferSighting, error) {
	stmt := q("event_sightings")
	rows, err := db.pool.Query(ctx, stmt.text, eventID)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TransferSighting, error) {
		var s TransferSighting
		return s, row.Scan(&s.BlockHash, &s.Removed, &s.Reporter, &s.FirstAt, &s.RemovedAt)
	})
	return out, classify(stmt.name, err)
}
