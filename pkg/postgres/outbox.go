package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// OutboxClaimMax bounds one claim; the scheduler's batch setting must not
// exceed it.
const OutboxClaimMax = 5000

// Claimed is an event the enqueuer moved to 'enqueued' and must now hand
// to the queue.
type Claimed struct {
	Event     payment.Event
	CreatedAt time.Time
	// TaskID names the task of the claim that carries this event (a row
	// claimed alone has a task of its own). Empty only for an event of
	// an older version's claim, whose task id derived from its key.
	TaskID string
	// TraceParent is the W3C traceparent stored with the event ("" for
	// none): its task carries it on, so the trace continues per event.
	TraceParent string
}

// TaskEventsMax bounds the events of one task; the enqueuer's setting
// must not exceed it.
const TaskEventsMax = 256

// ClaimOutbox moves up to pendingMax pending events and up to dueMax
// waiting deposits whose re-check is due (network by network in turns,
// so one network's backlog never holds another's back) to 'enqueued',
// cut into tasks of at most taskMax events, and commits. The
// caller enqueues them only after this returns: a worker must never see a
// task before the database says 'enqueued'. If enqueueing then fails, the
// rows stay 'enqueued' and stale recovery brings them back.
func (db *DB) ClaimOutbox(ctx context.Context, pendingMax, dueMax, taskMax int) ([]Claimed, error) {
	if pendingMax < 0 || dueMax < 0 || pendingMax+dueMax > OutboxClaimMax {
		return nil, fmt.Errorf("claim of %d+%d outside 0..%d", pendingMax, dueMax, OutboxClaimMax)
	}
	if taskMax < 1 || taskMax > TaskEventsMax {
		return nil, fmt.Errorf("events per task %d outside 1..%d", taskMax, TaskEventsMax)
	}
	// One round trip, as ingest does: at a trickle every event has a claim
	// of its own, and each round trip is a wake-up of the scheduler and of
	// a backend (four of them before: BEGIN, SET, claim, COMMIT). The
	// batch's one Sync ends its implicit transaction, so it needs no
	// BEGIN or COMMIT statement either.
	b := &pgx.Batch{}
	b.Queue(q("hot_path_plans").text)
	b.Queue(q("claim_outbox").text, pendingMax, dueMax, taskMax)
	claimed, claimErr, err := readClaim(db.pool.SendBatch(ctx, b))
	if claimErr != nil {
		// The set-based claim failed and its transaction rolled back.
		return db.claimRowByRow(ctx, pendingMax, dueMax)
	}
	if err != nil {
		return nil, err
	}
	return claimed, nil
}

// readClaim reads ClaimOutbox's batch and closes it: claimErr is the
// claim statement's own failure (its transaction then rolls back), err
// any other, the commit's included (Close's).
func readClaim(br pgx.BatchResults) (claimed []Claimed, claimErr, err error) {
	defer func() {
		if closeErr := br.Close(); err == nil && claimErr == nil && closeErr != nil {
			claimed, err = nil, classify("claim outbox commit", closeErr)
		}
	}()
	if _, err := br.Exec(); err != nil {
		return nil, nil, classify("hot path plans", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, classify("claim_outbox", err), nil
	}
	for rows.Next() {
		c, err := scanClaimed(rows)
		if err != nil {
			rows.Close()
			return nil, classify("claim_outbox", err), nil
		}
		claimed = append(claimed, c)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("claim_outbox", err), nil
	}
	return claimed, nil, nil
}

// claimRowByRow is the fallback when the set-based claim fails: each row
// moves in its own savepoint, and a row that fails stays where it is.
func (db *DB) claimRowByRow(ctx context.Context, pendingMax, dueMax int) ([]Claimed, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return nil, classify("claim outbox", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("outbox_candidates")
	rows, err := tx.Query(ctx, stmt.text, pendingMax, dueMax)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	var claimed []Claimed
	for _, id := range ids {
		sp, err := tx.Begin(ctx) // SAVEPOINT
		if err != nil {
			return nil, classify("savepoint", err)
		}
		var one []Claimed
		_, _, err = transition(ctx, sp, q("claim_one"), nil, func(rows pgx.Rows) (string, error) {
			c, err := scanClaimed(rows)
			one = append(one, c)
			return c.Event.ID, err
		}, id)
		if err != nil {
			_ = sp.Rollback(ctx) // ROLLBACK TO SAVEPOINT: this row stays behind
			continue
		}
		if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
			return nil, classify("release savepoint", err)
		}
		claimed = append(claimed, one...)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, classify("claim outbox commit", err)
	}
	return claimed, nil
}

func scanClaimed(rows pgx.Rows) (Claimed, error) {
	var c Claimed
	var eventType, amount string
	var generation int32
	if err := rows.Scan(&c.Event.ID, &eventType, &c.Event.UserID, &c.Event.Asset, &amount, &c.Event.TxHash,
		&c.Event.TraceID, &generation, &c.CreatedAt, &c.TaskID, &c.TraceParent); err != nil {
		return c, err
	}
	c.Event.Type = payment.EventType(eventType)
	c.Event.Amount = decimal.RequireFromString(amount)
	c.Event.Generation = int(generation)
	return c, nil
}
