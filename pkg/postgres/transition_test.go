package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// pathTo walks a new event from pending to each status along allowed edges.
var pathTo = map[payment.Status][]payment.Status{
	payment.StatusPending:          nil,
	payment.StatusEnqueued:         {payment.StatusEnqueued},
	payment.StatusProcessing:       {payment.StatusEnqueued, payment.StatusProcessing},
	payment.StatusAwaitingFinality: {payment.StatusEnqueued, payment.StatusAwaitingFinality},
	payment.StatusConfirmed:        {payment.StatusEnqueued, payment.StatusConfirmed},
	payment.StatusFailed:           {payment.StatusFailed},
}

// moveSQL sets a status together with the columns the other constraints
// tie to it, so that only the transition guard can refuse the move.
const moveSQL = `UPDATE payment_events SET status = $2,
	outcome = CASE WHEN $2 IN ('confirmed', 'failed') THEN 'success' ELSE NULL END,
	next_check_at = CASE WHEN $2 = 'awaiting_finality' THEN now() ELSE NULL END
	WHERE event_id = $1`

// TestDatabaseMirrorsTransitionTable tries every (from, to) pair against
// PostgreSQL and requires the trigger to agree with payment.CanTransition.
func TestDatabaseMirrorsTransitionTable(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	for _, from := range payment.Statuses {
		for _, to := range payment.Statuses {
			if from == to {
				continue
			}
			tx, err := f.sql.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash)
				VALUES ('edge', 'deposit', 1, 'ETH', 1, decode(repeat('00', 32), 'hex'))`)
			require.NoError(t, err)
			for _, step := range pathTo[from] {
				_, err := tx.Exec(ctx, moveSQL, "edge", string(step))
				require.NoError(t, err, "walking to %s via %s", from, step)
			}
			_, err = tx.Exec(ctx, moveSQL, "edge", string(to))
			allowed := err == nil
			if err != nil {
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "%s → %s: %v", from, to, err)
				require.Equal(t, "23514", pgErr.Code)
				require.Contains(t, pgErr.Message, "is not allowed", "%s → %s refused by another constraint: %v", from, to, err)
			}
			require.Equal(t, payment.CanTransition(from, to), allowed, "%s → %s: Go table and database disagree", from, to)
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

func TestEventsMustBeInsertedPending(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	_, err := f.sql.Exec(context.Background(), `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, status, outcome)
		VALUES ('x', 'deposit', 1, 'ETH', 1, decode(repeat('00', 32), 'hex'), 'confirmed', 'success')`)
	require.Error(t, err)
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events`))
}

// TestTransitionGuardIsReadCheaply: PostgreSQL reads the guard's WHEN
// back from its stored node tree for every statement that changes
// status; as twelve row comparisons it was 11.7 kB of it (migration 0018).
func TestTransitionGuardIsReadCheaply(t *testing.T) {
	f := newFixture(t)
	n := f.count(`SELECT length(tgqual::text) FROM pg_trigger
		WHERE tgrelid = 'payment_events'::regclass AND tgname = 'payment_events_transition_guard'`)
	require.Less(t, n, 4096, "the transition guard's WHEN clause is %d bytes of node tree", n)
}
