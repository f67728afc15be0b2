package postgres

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestStatusInsertsMustDeclareTheirStatuses: an insert into
// payment_events that names status declares what it may insert, only
// statuses the insert guard admits; the declaration excuses no UPDATE.
func TestStatusInsertsMustDeclareTheirStatuses(t *testing.T) {
	parse := func(text string) error {
		_, err := parseQueries(fstest.MapFS{"queries/x.sql": {Data: []byte(text)}})
		return err
	}
	require.ErrorContains(t, parse("-- name: sneaky\nINSERT INTO payment_events (event_id, status) VALUES ($1, 'enqueued');\n"),
		"without a -- insert status: line")
	require.ErrorContains(t, parse("-- name: born_done\n-- insert status: pending, confirmed\nINSERT INTO payment_events (event_id, status) VALUES ($1, $2);\n"),
		`cannot be inserted "confirmed"`)
	require.ErrorContains(t, parse("-- name: both\n-- insert status: pending\nWITH i AS (INSERT INTO payment_events (event_id, status) VALUES ($1, 'pending'))\n"+
		"UPDATE payment_events SET status = 'enqueued' WHERE event_id = $2;\n"), "without a -- transition: line")
	require.NoError(t, parse("-- name: plain\nINSERT INTO payment_events (event_id, amount) VALUES ($1, $2);\n"))

	stmt := q("insert_events")
	require.Equal(t, []payment.Status{payment.StatusPending, payment.StatusEnqueued}, stmt.inserts)
	require.Empty(t, stmt.to, "an insert is no transition: transition() must refuse to run it")
}
