package postgres_test

import (
	"context"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TestRowByRowClaimNamesAFreshTask: when the set-based claim fails (one
// row it cannot move), the fallback claims the others one by one. A
// deposit parked for finality keeps its generation, so each of its claims
// needs a task id of its own: the id its key derives was taken by its
// first task, which the queue keeps after it ran, and a second enqueue
// under it was dropped as a duplicate, the deposit left in 'enqueued'
// until stale recovery found it minutes later.
func TestRowByRowClaimNamesAFreshTask(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	for _, id := range []string{"parked", "bad"} {
		_, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH",
			Amount: decimal.RequireFromString("1"), TraceID: "tr"}})
		require.NoError(t, err)
	}
	// The set-based claim fails on "bad" (as a row breaking a constraint
	// added NOT VALID would); the fallback claims the rest.
	_, err := f.sql.Exec(ctx, `CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.event_id = 'bad' THEN RAISE EXCEPTION 'bad row'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_bad BEFORE UPDATE ON payment_events FOR EACH ROW EXECUTE FUNCTION refuse_bad()`)
	require.NoError(t, err)

	var ids []string
	for range 2 {
		claimed, err := f.db.ClaimOutbox(ctx, 10, 10, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, 1, "the other row is claimed alone")
		require.Equal(t, "parked", claimed[0].Event.ID)
		require.Equal(t, 0, claimed[0].Event.Generation, "parking keeps the generation")
		require.NotEmpty(t, claimed[0].TaskID, "a fallback claim names its task")
		ids = append(ids, claimed[0].TaskID)
		require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'parked' AND task_id = $1`, claimed[0].TaskID),
			"the row keeps its task's id, as stale recovery reads it")
		// The gate parks it for finality, as a worker does.
		_, err = f.sql.Exec(ctx, `UPDATE payment_events SET status = 'awaiting_finality', next_check_at = now() - interval '1 second'
			WHERE event_id = 'parked'`)
		require.NoError(t, err)
	}
	require.NotEqual(t, ids[0], ids[1], "each claim of the parked deposit has a task id of its own")
	st, _ := f.status("bad")
	require.Equal(t, payment.StatusPending, st, "the bad row stays behind")
}
