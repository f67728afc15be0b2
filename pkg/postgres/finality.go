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

// Wait records that a deposit is not final yet.
type Wait struct {
	// RecheckIn is added to the database's clock (now() + RecheckIn), so a
	// worker's skewed clock never moves the schedule.
	RecheckIn   time.Duration
	ReceiptSeen bool
	BlockNumber int64 // 0 when unknown
	BlockHash   string
	Note        string // why it waits, shown by GET /v1/events
}

// AwaitFinality parks the live task's deposit in 'awaiting_finality' until
// the next check. It reports false if the event moved on meanwhile.
func (db *DB) AwaitFinality(ctx context.Context, e payment.Event, w Wait) (bool, error) {
	var block *int64
	var hash *string
	if w.BlockNumber > 0 {
		block = &w.BlockNumber
	}
	if w.BlockHash != "" {
		hash = &w.BlockHash
	}
	moved, _, err := transition(ctx, db.pool, q("await_finality"), nil, nil,
		e.ID, e.Generation, interval(w.RecheckIn), w.ReceiptSeen, block, hash, w.Note)
	return moved[e.ID], err
}

// ChainWaitState is what the finality path needs to decide a timeout.
type ChainWaitState struct {
	ReceiptSeen bool
	CreatedAt   time.Time
	// Age is now() - created_at (reopened_at for a reopened deposit) on
	// the database's clock.
	Age    time.Duration
	Checks int
	// ToAddress is the recipient the provider named, if any.
	ToAddress string
	// TransferIndex is the transfer the deposit names, if it names one.
	TransferIndex string
	// Network is where the deposit's transaction lives.
	Network string
	// BlockNumber and BlockHash are where its receipt was last seen (0
	// and "": never).
	BlockNumber int64
	BlockHash   string
}

// ChainWait reads an event's finality history.
func (db *DB) ChainWait(ctx context.Context, eventID string) (ChainWaitState, error) {
	stmt := q("chain_wait_state")
	var s ChainWaitState
	var ageMicros int64
	err := db.pool.QueryRow(ctx, stmt.text, eventID).Scan(&s.ReceiptSeen, &s.CreatedAt, &ageMicros, &s.Checks, &s.ToAddress, &s.TransferIndex, &s.Network,
		&s.BlockNumber, &s.BlockHash)
	s.Age = time.Duration(ageMicros) * time.Microsecond
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
	}
	return s, classify(stmt.name, err)
}

// DecideChainOutcome fails the live task's deposit with a business outcome
// (reverted, mismatch, reorged, not_found) and records it on its
// idempotency key, in one transaction.
func (db *DB) DecideChainOutcome(ctx context.Context, e payment.Event, outcome payment.Outcome, reason string) (bool, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return false, classify("decide chain outcome", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	moved, _, err := transition(ctx, tx, q("decide_chain_outcome"), nil, func(rows pgx.Rows) (string, error) {
		var id string
		var seen bool
		return id, rows.Scan(&id, &seen)
	}, e.ID, e.Generation, string(outcome), reason)
	if err != nil || !moved[e.ID] {
		return false, err
	}
	stmt := q("record_outcome")
	if _, err := tx.Exec(ctx, stmt.text, e.Key(), e.ID, string(outcome)); err != nil {
		return false, classify(stmt.name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, classify("decide chain outcome commit", err)
	}
	return true, nil
}

// WatchedDeposit is a credited deposit still followed for reorgs.
type WatchedDeposit struct {
	EventID     string
	UserID      int64
	Asset       string
	TxHash      string
	BlockNumber int64
	BlockHash   string
	TraceID     string
	Network     string
	// Amount, ToAddress (the recipient the provider named, if any) and
	// TransferIndex (the transfer the deposit names, if any) say what
	// the deposit claims of its transaction.
	Amount        decimal.Decimal
	ToAddress     string
	TransferIndex string
	// LogPosition is the position within its transaction of the log the
	// deposit's claim holds (a token's), nil when none is known.
	LogPosition *int64
	// Type is payment.WithdrawalPost for a post's payout, watched only to
	// report it gone (MarkPayoutReorged); HoldID is then its hold.
	Type   payment.EventType
	HoldID string
}

// WatchedDeposits lists deposits credited before finality on each of
// networks, up to perNetwork of each, least recently checked first.
func (db *DB) WatchedDeposits(ctx context.Context, networks []string, perNetwork int) ([]WatchedDeposit, error) {
	if len(networks) == 0 {
		return nil, nil
	}
	stmt := q("watched_deposits")
	rows, err := db.pool.Query(ctx, stmt.text, networks, perNetwork)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var out []WatchedDeposit
	for rows.Next() {
		var w WatchedDeposit
		var amount, eventType string
		if err := rows.Scan(&w.EventID, &w.UserID, &w.Asset, &w.TxHash, &w.BlockNumber, &w.BlockHash, &w.TraceID, &w.Network,
			&amount, &w.ToAddress, &w.TransferIndex, &w.LogPosition, &eventType, &w.HoldID); err != nil {
			return nil, classify(stmt.name, err)
		}
		w.Type = payment.EventType(eventType)
		w.Amount = decimal.RequireFromString(amount) // NUMERIC's text always parses
		out = append(out, w)
	}
	return out, classify(stmt.name, rows.Err())
}

// MarkFinal stops watching a deposit whose block is finalized; one that
// was compensated for a reorg and watched again is given back (givenBack).
func (db *DB) MarkFinal(ctx context.Context, eventID string) (givenBack bool, err error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return false, classify("mark final", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("mark_final")
	tag, err := tx.Exec(ctx, stmt.text, eventID)
	if err != nil {
		return false, classify(stmt.name, err)
	}
	if tag.RowsAffected() == 1 {
		if givenBack, err = giveBackIfCompensated(ctx, tx, eventID); err != nil {
			return false, err
		}
	}
	return givenBack, classify("mark final commit", tx.Commit(ctx))
}

// MarkPayoutReorged records that a watched post's payout transaction,
// seen in block fromHash, left the canonical chain: chain_state
// 'reorged', reason in its error, and it is no longer watched. It moves
// no money and changes no outcome or hold. False: the post was no longer
// watched in that block (another pass decided first).
func (db *DB) MarkPayoutReorged(ctx context.Context, eventID, fromHash, reason string) (bool, error) {
	stmt := q("mark_payout_reorged")
	tag, err := db.pool.Exec(ctx, stmt.text, eventID, fromHash, reason)
	if err != nil {
		return false, classify(stmt.name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// TouchWatched moves a still-canonical deposit to the back of the watch
// list, so one pass of a bounded size eventually covers all of them.
func (db *DB) TouchWatched(ctx context.Context, eventID string) error {
	stmt := q("touch_watched")
	_, err := db.pool.Exec(ctx, stmt.text, eventID)
	return classify(stmt.name, err)
}

// KeepWatching moves a deposit seen canonical where its evidence says to
// the back of the watch list and forgets any absence recorded before.
func (db *DB) KeepWatching(ctx context.Context, eventID string) error {
	stmt := q("keep_watching")
	_, err := db.pool.Exec(ctx, stmt.text, eventID)
	return classify(stmt.name, err)
}

// MoveEvidence records that a watched deposit's transaction is canonical
// in another block, and stops watching it if that block is final (giving
// back a compensated deposit watched again, as MarkFinal does). It
// reports moved false if the deposit was no longer watched in block
// fromHash.
func (db *DB) MoveEvidence(ctx context.Context, eventID, fromHash string, blockNumber int64, blockHash string, final bool) (moved, givenBack bool, err error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return false, false, classify("move evidence", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("move_evidence")
	tag, err := tx.Exec(ctx, stmt.text, eventID, fromHash, blockNumber, blockHash, final)
	if err != nil {
		return false, false, classify(stmt.name, err)
	}
	moved = tag.RowsAffected() == 1
	if moved && final {
		if givenBack, err = giveBackIfCompensated(ctx, tx, eventID); err != nil {
			return false, false, err
		}
	}
	return moved, givenBack, classify("move evidence commit", tx.Commit(ctx))
}

// Absence is what RecordAbsence found.
type Absence struct {
	// First: no absence was recorded before; this read is the first.
	First bool
	// Since is how long ago the first absence was recorded (database clock).
	Since time.Duration
	// HeadThen is the head seen at the first absence.
	HeadThen int64
	// Evidence: this read is at least the delay and one new block after
	// the first, so the transaction is gone.
	Evidence bool
}

// RecordAbsence notes that a watched deposit's receipt is missing while
// the chain shows nothing else, with the head seen now. A second absence
// at least delay later (on the database's clock) and with a higher head
// is evidence. Watched no longer in block blockHash: the zero Absence.
func (db *DB) RecordAbsence(ctx context.Context, eventID, blockHash string, head int64, delay time.Duration) (Absence, error) {
	return db.recordAbsence(ctx, q("record_absence"), eventID, blockHash, head, interval(delay))
}

// RecordWaitAbsence is RecordAbsence for the live task of a deposit still
// waiting for finality whose receipt is missing: seen before in block
// blockHash, or never seen (blockHash "", past FINALITY_TIMEOUT, where
// not_found needs the same two reads as reorged). The task no longer
// live, or its receipt seen (elsewhere) since: the zero Absence.
func (db *DB) RecordWaitAbsence(ctx context.Context, e payment.Event, blockHash string, head int64, delay time.Duration) (Absence, error) {
	return db.recordAbsence(ctx, q("record_wait_absence"), e.ID, e.Generation, nullable(blockHash), head, interval(delay))
}

// recordAbsence runs one of the absence statements, which answer alike;
// no row (the guard no longer holds) is the zero Absence.
func (db *DB) recordAbsence(ctx context.Context, stmt query, args ...any) (Absence, error) {
	var a Absence
	var sinceMicros int64
	err := db.pool.QueryRow(ctx, stmt.text, args...).Scan(&a.First, &sinceMicros, &a.HeadThen, &a.Evidence)
	if errors.Is(err, pgx.ErrNoRows) {
		return Absence{}, nil
	}
	a.Since = time.Duration(sinceMicros) * time.Microsecond
	return a, classify(stmt.name, err)
}
