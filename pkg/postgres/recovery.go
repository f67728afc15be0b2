package postgres

import (
	"context"
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

// RecoveryReport counts what a pass did.
type RecoveryReport struct {
	Examined, Skipped, Requeued int
	DeadLettered                []payment.DeadLetter
	Failed                      int // rows whose savepoint failed; left for the next pass
}

// RecoverStale locks up to limit events stuck in 'enqueued' for longer
// than staleAfter and applies decide to each, every row in its own
// savepoint so one bad row cannot undo the others. decide runs while the
// rows are locked and must be bounded in time.
func (db *DB) RecoverStale(ctx context.Context, staleAfter time.Duration, limit int, decide func(context.Context, StaleEvent) (RecoveryAction, string)) (RecoveryReport, error) {
	var report RecoveryReport
	if limit <= 0 || limit > RecoveryBatchMax {
		return report, fmt.Errorf("recovery batch %d outside 1..%d", limit, RecoveryBatchMax)
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return report, classify("recover stale", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("stale_enqueued")
	rows, err := tx.Query(ctx, stmt.text, fmt.Sprintf("%d milliseconds", staleAfter.Milliseconds()), limit)
	if err != nil {
		return report, classify(stmt.name, err)
	}
	var stale []StaleEvent
	for rows.Next() {
		var s StaleEvent
		var eventType, amount string
		var generation, retries int32
		if err := rows.Scan(&s.Event.ID, &eventType, &s.Event.UserID, &s.Event.Asset, &amount, &s.Event.TraceID, &retries, &generation, &s.UpdatedAt, &s.TaskID); err != nil {
			rows.Close()
			return report, classify(stmt.name, err)
		}
		s.Event.Type, s.Event.Amount = payment.EventType(eventType), decimal.RequireFromString(amount)
		s.Event.Generation, s.RetryCount = int(generation), int(retries)
		stale = append(stale, s)
	}
	if err := rows.Err(); err != nil {
		return report, classify(stmt.name, err)
	}
	for _, s := range stale {
		report.Examined++
		action, reason := decide(ctx, s)
		if action == RecoverySkip {
			report.Skipped++
			continue
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return report, classify("savepoint", err)
		}
		var letter *payment.DeadLetter
		switch action {
		case RecoveryRequeue:
			_, refused, terr := transition(ctx, sp, q("requeue_stale"), []string{s.Event.ID}, nil, s.Event.ID, s.Event.Generation)
			err = firstErr(terr, refusedErr(refused, s.Event.ID, payment.StatusPending))
		case RecoveryDeadLetter:
			_, refused, terr := transition(ctx, sp, q("fail_stale"), []string{s.Event.ID}, nil, s.Event.ID, s.Event.Generation, reason)
			err = firstErr(terr, refusedErr(refused, s.Event.ID, payment.StatusFailed))
			if err == nil {
				letter = &payment.DeadLetter{
					EventID: s.Event.ID, EventType: string(s.Event.Type), UserID: s.Event.UserID, Asset: s.Event.Asset,
					Amount: s.Event.Amount.String(), Error: reason, Attempt: s.RetryCount + 1, Generation: s.Event.Generation,
					Source: payment.SourceRecovery, TraceID: s.Event.TraceID,
				}
				_, err = insertDeadLetters(ctx, sp, []payment.DeadLetter{*letter})
			}
		default:
			err = fmt.Errorf("unknown recovery action %d", action)
		}
		if err != nil {
			_ = sp.Rollback(ctx)
			report.Failed++
			continue
		}
		if err := sp.Commit(ctx); err != nil {
			return report, classify("release savepoint", err)
		}
		if letter != nil {
			report.DeadLettered = append(report.DeadLettered, *letter)
		} else {
			report.Requeued++
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return RecoveryReport{}, classify("recover stale commit", err)
	}
	return report, nil
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
