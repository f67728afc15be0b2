package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// Refusal is the state of an event a transition statement did not move.
type Refusal struct {
	Found      bool
	Status     payment.Status
	Generation int
	Outcome    payment.Outcome // "" until terminal
}

// Err classifies the refusal with the seed's semantics: the target already
// reached is no refusal at all (nil); a terminal event is already
// processed; a missing one is not found; anything else is a concurrent
// move, retryable.
func (r Refusal) Err(eventID string, from []payment.Status, to payment.Status) error {
	if !r.Found {
		return fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
	}
	if r.Status == to {
		return nil
	}
	first := payment.Status("")
	if len(from) > 0 {
		first = from[0]
	}
	return &payment.TransitionError{EventID: eventID, From: first, To: to, Actual: r.Status}
}

// transition is the one place that writes payment_events.status. It runs
// a statement from queries/*.sql that declares its edges (checked against
// the transition table when the package loads) and returns event_id first
// in each RETURNING row; scan, if given, reads a whole row and returns its
// event id. Events in expect that were not moved come back as refusals,
// with their actual status, for the caller to classify.
func transition(ctx context.Context, qr querier, stmt query, expect []string, scan func(rows pgx.Rows) (string, error), args ...any) (map[string]bool, map[string]Refusal, error) {
	if stmt.to == "" {
		panic(fmt.Sprintf("postgres: query %q is not a transition", stmt.name))
	}
	rows, err := qr.Query(ctx, stmt.text, args...)
	if err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	moved := map[string]bool{}
	for rows.Next() {
		var eventID string
		if scan == nil {
			err = rows.Scan(&eventID)
		} else {
			eventID, err = scan(rows)
		}
		if err != nil {
			rows.Close()
			return nil, nil, classify(stmt.name, err)
		}
		moved[eventID] = true
	}
	if err := rows.Err(); err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	var missing []string
	for _, id := range expect {
		if !moved[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return moved, nil, nil
	}
	refused, err := eventStates(ctx, qr, missing)
	return moved, refused, err
}

// eventStates reads the status of events a transition did not move.
func eventStates(ctx context.Context, qr querier, ids []string) (map[string]Refusal, error) {
	stmt := q("event_states")
	rows, err := qr.Query(ctx, stmt.text, ids)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	out := make(map[string]Refusal, len(ids))
	for _, id := range ids {
		out[id] = Refusal{}
	}
	for rows.Next() {
		var id string
		var r Refusal
		if err := rows.Scan(&id, &r.Status, &r.Generation, &r.Outcome); err != nil {
			return nil, classify(stmt.name, err)
		}
		r.Found = true
		out[id] = r
	}
	return out, classify(stmt.name, rows.Err())
}

// queueTransition is transition's pipelined form, for statements sent
// ahead of a COMMIT in one batch. Such a statement must assert its own row
// count (settle_assert), because nobody reads it before the COMMIT runs.
func queueTransition(batch *pgx.Batch, stmt query, args ...any) {
	if stmt.to == "" {
		panic(fmt.Sprintf("postgres: query %q is not a transition", stmt.name))
	}
	batch.Queue(stmt.text, args...)
}
