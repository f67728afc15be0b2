package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// SupersedeResult is what SupersedeDeposit did with a conflicting report.
type SupersedeResult string

const (
	// SupersedeRefused: the stored event is not a failed/mismatch deposit
	// of this transfer; it stays as it is and the report is a conflict.
	SupersedeRefused SupersedeResult = "refused"
	// SupersedeDone: the report's content replaced the stored one, and the
	// deposit went back to pending for the finality gate.
	SupersedeDone SupersedeResult = "superseded"
	// SupersedeSame: the stored content is already the report's (another
	// report superseded it first): a duplicate.
	SupersedeSame SupersedeResult = "same"
)

// supersedeChainState is what the chain showed the replaced content, as
// the recorded history says it.
const supersedeChainState = "mismatch"

// SupersedeDeposit lets a report of a transfer whose content conflicts
// with the stored deposit of the same transfer replace it, in one
// transaction, when and only when that deposit ended failed with outcome
// mismatch: the chain contradicted the stored content, and no money
// moved. The deposit is reopened as ReopenDeposit does (new generation,
// reopened_at, idempotency record 'reopened'), goes through the finality
// gate again, and the replaced content is recorded in event_rechecks
// under reporter. Any other stored state is SupersedeRefused, unchanged.
func (db *DB) SupersedeDeposit(ctx context.Context, e NewEvent, reporter string) (SupersedeResult, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return "", classify("supersede deposit", err)
	}
	defer rollbackDetached(ctx, tx)
	result, err := supersedeDeposit(ctx, tx, e, reporter)
	if err != nil || result != SupersedeDone {
		return result, err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", classify("supersede deposit commit", err)
	}
	return SupersedeDone, nil
}

// supersedable tells whether a new event may supersede at all: a deposit
// whose id is its own transfer's identity (providers and the scanner
// make those; /webhook/payments may not use the prefix).
func supersedable(e NewEvent) bool {
	ev := e.Event
	return ev.Type == payment.Deposit && ev.TxHash != "" && ev.TransferIndex != "" && ev.Network != "" &&
		strings.HasPrefix(ev.ID, payment.TransferEventIDPrefix) &&
		ev.ID == (payment.Transfer{Network: ev.Network, TxHash: ev.TxHash, Index: ev.TransferIndex}).EventID()
}

// supersedeDeposit is SupersedeDeposit inside the caller's transaction.
func supersedeDeposit(ctx context.Context, tx pgx.Tx, e NewEvent, reporter string) (SupersedeResult, error) {
	if !supersedable(e) {
		return SupersedeRefused, nil
	}
	ev := e.Event
	if e.Source == "" {
		e.Source = SourcePayments
	}
	hash := ev.Content().Hash()
	stmt := q("supersede_target")
	var was struct {
		eventType, status, outcome, asset, amount, to, source, txHash, index, network string
		user                                                                          int64
		hash                                                                          []byte
	}
	err := tx.QueryRow(ctx, stmt.text, ev.ID).Scan(&was.eventType, &was.status, &was.outcome, &was.user, &was.asset, &was.amount,
		&was.to, &was.source, &was.hash, &was.txHash, &was.index, &was.network)
	if errors.Is(err, pgx.ErrNoRows) {
		return SupersedeRefused, nil
	}
	if err != nil {
		return "", classify(stmt.name, err)
	}
	switch {
	case bytes.Equal(was.hash, hash):
		return SupersedeSame, nil
	case was.eventType != string(payment.Deposit) || was.status != string(payment.StatusFailed) ||
		was.outcome != string(payment.OutcomeMismatch) || was.txHash != ev.TxHash || was.index != ev.TransferIndex || was.network != ev.Network:
		return SupersedeRefused, nil
	}
	reason := reporter + " reported the transfer with other content after the chain contradicted the stored one"
	moved, _, err := transition(ctx, tx, q("supersede_deposit"), nil, nil, ev.ID, ev.UserID, ev.Asset, ev.Amount.String(),
		nullable(e.recipient()), hash, string(e.Source), ev.TraceID, reason, ev.TxHash, ev.TransferIndex, ev.Network)
	if err != nil {
		return "", err
	}
	if !moved[ev.ID] {
		return SupersedeRefused, nil
	}
	stmt = q("reopen_outcome")
	if _, err := tx.Exec(ctx, stmt.text, payment.IdempotencyKey(ev.ID, ev.Type), ev.ID); err != nil {
		return "", classify(stmt.name, err)
	}
	detail := fmt.Sprintf("superseded by %s's report: was %s %s to %s of user %d (stored by %s); now %s %s to %s of user %d",
		reporter, decimal.RequireFromString(was.amount).String(), was.asset, orNone(was.to), was.user, was.source, ev.Amount.String(), ev.Asset, orNone(e.recipient()), ev.UserID)
	stmt = q("insert_recheck")
	var id int64
	var at time.Time
	if err := tx.QueryRow(ctx, stmt.text, ev.ID, reporter, supersedeChainState, string(RecheckReopened), detail).Scan(&id, &at); err != nil {
		return "", classify(stmt.name, err)
	}
	return SupersedeDone, nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// supersedeInPass is a scan pass's supersede of a conflicting deposit,
// in a savepoint: a refusal by the database leaves the pass's other
// deposits to commit and the conflict as it was.
func supersedeInPass(ctx context.Context, tx pgx.Tx, e NewEvent) (SupersedeResult, error) {
	if !supersedable(e) {
		return SupersedeRefused, nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return "", classify("supersede savepoint", err)
	}
	result, err := supersedeDeposit(ctx, sp, e, string(e.Source))
	if err != nil {
		_ = sp.Rollback(ctx)
		if errors.Is(err, payment.ErrInvalid) {
			return SupersedeRefused, nil
		}
		return "", err
	}
	return result, classify("supersede release", sp.Commit(ctx))
}
