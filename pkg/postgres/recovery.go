package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// RecoveryBatchMax bounds one recovery pass.
const RecoveryBatchMax = 1000

// StaleEvent is an event stuck in 'enqueued'.
type StaleEvent struct {
	Event      payment.Event
	RetryCount int
	UpdatedAt  time.Time
	// TaskID is the id of the task that carries the event, empty when it
	// derives from the event's key.
	TaskID string
}

// RecoveryAction is what the caller decides for one stale event.
type RecoveryAction int

const (
	// RecoverySkip: the queue still holds the task (waiting or retrying);
	// it is slow, not lost. Nothing changes and no attempt is counted.
	RecoverySkip RecoveryAction = iota + 1
	// RecoveryRequeue: back to 'pending' under a new generation.
	RecoveryRequeue
	// RecoveryDeadLetter: out of recovery attempts: failed + DLQ.
	RecoveryDeadLetter
)

// StaleCursor is where a page of stale events ended: the next page
// starts after it. The zero value starts at the oldest.
type StaleCursor struct {
	UpdatedAt time.Time
	EventID   string
}

// RecoveryReport counts what a pass did.
type RecoveryReport struct {
	Examined, Skipped, Requeued int
	DeadLettered                []payment.DeadLetter
	Failed                      int // rows whose savepoint failed; left for the next pass
	// Next is the cursor after the last event examined (after, when
	// none was).
	Next StaleCursor
}

// RecoverStale reads up to limit events stuck in 'enqueued' for longer
// than staleAfter, oldest first after the cursor after, and applies
// decide to each. decide asks the queue, so it
// runs outside any transaction and holds no row lock while it waits on
// Redis: the ledger is never stalled behind a slow queue. Each decision is
// then written in a short transaction of its own, guarded by the
// generation that was read, so an event the ledger settled meanwhile, or
// that another scheduler recovered first, is left alone.
func (db *DB) RecoverStale(ctx context.Context, staleAfter time.Duration, limit int, after StaleCursor, decide func(context.Context, StaleEvent) (RecoveryAction, string)) (RecoveryReport, error) {
	report := RecoveryReport{Next: after}
	if limit <= 0 || limit > RecoveryBatchMax {
		return report, fmt.Errorf("recovery batch %d outside 1..%d", limit, RecoveryBatchMax)
	}
	stale, err := db.staleEnqueued(ctx, staleAfter, limit, after)
	if err != nil {
		return report, err
	}
	for _, s := range stale {
		report.Examined++
		report.Next = StaleCursor{UpdatedAt: s.UpdatedAt, EventID: s.Event.ID}
		action, reason := decide(ctx, s)
		if action == RecoverySkip {
			report.Skipped++
			continue
		}
		letter, err := db.recoverOne(ctx, s, action, reason)
		switch {
		case errors.Is(err, payment.ErrUnavailable):
			return report, err
		case err != nil:
			report.Failed++
		case letter != nil:
			report.DeadLettered = append(report.DeadLettered, *letter)
		default:
			report.Requeued++
		}
	}
	return report, nil
}

func (db *DB) staleEnqueued(ctx context.Context, staleAfter time.Duration, limit int, after StaleCursor) ([]StaleEvent, error) {
	stmt := q("stale_enqueued")
	rows, err := db.pool.Query(ctx, stmt.text, fmt.Sprintf("%d milliseconds", staleAfter.Milliseconds()), limit, after.UpdatedAt, after.EventID)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var stale []StaleEvent
	for rows.Next() {
		var s StaleEvent
		var eventType, amount string
		var generation, retries int32
		if err := rows.Scan(&s.Event.ID, &eventType, &s.Event.UserID, &s.Event.Asset, &amount, &s.Event.TraceID, &retries, &generation, &s.UpdatedAt, &s.TaskID); err != nil {
			return nil, classify(stmt.name, err)
		}
		s.Event.Type, s.Event.Amount = payment.EventType(eventType), decimal.RequireFromString(amount)
		s.Event.Generation, s.RetryCount = int(generation), int(retries)
		stale = append(stale, s)
	}
	return stale, classify(stmt.name, rows.Err())
}

// recoverOne writes one decision: back to the outbox, or failed with its
// dead letter, in one transaction; a refused transition (the generation
// moved on) is an error and changes nothing.
func (db *DB) recoverOne(ctx context.Context, s StaleEvent, action RecoveryAction, reason string) (*payment.DeadLetter, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return nil, classify("recover stale", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var letter *payment.DeadLetter
	switch action {
	case RecoveryRequeue:
		_, refused, terr := transition(ctx, tx, q("requeue_stale"), []string{s.Event.ID}, nil, s.Event.ID, s.Event.Generation)
		err = firstErr(terr, refusedErr(refused, s.Event.ID, payment.StatusPending))
	case RecoveryDeadLetter:
		_, refused, terr := transition(ctx, tx, q("fail_stale"), []string{s.Event.ID}, nil, s.Event.ID, s.Event.Generation, reason)
		err = firstErr(terr, refusedErr(refused, s.Event.ID, payment.StatusFailed))
		if err == nil {
			letter = &payment.DeadLetter{
				EventID: s.Event.ID, EventType: string(s.Event.Type), UserID: s.Event.UserID, Asset: s.Event.Asset,
				Amount: s.Event.Amount.String(), Error: reason, Attempt: s.RetryCount + 1, Generation: s.Event.Generation,
				Source: payment.SourceRecovery, TraceID: s.Event.TraceID,
				// The generation's one failure: a worker's letter for it
				// parked in Redis meanwhile drains into nothing.
				FallbackID: payment.FailureKey(s.Event.ID, s.Event.Generation),
			}
			_, err = insertDeadLetters(ctx, tx, []payment.DeadLetter{*letter})
		}
	default:
		err = fmt.Errorf("unknown recovery action %d", action)
	}
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, classify("recover stale commit", err)
	}
	return letter, nil
}

func refusedErr(refused map[string]Refusal, id string, to payment.Status) error {
	r, ok := refused[id]
	if !ok {
		return nil
	}
	if err := r.Err(id, []payment.Status{payment.StatusEnqueued}, to); err != nil {
		return err
	}
	return fmt.Errorf("event %s: generation moved on", id)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
