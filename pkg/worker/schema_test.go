package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/task"
)

// TestSchemaBehindNeverDeadLettersAnEvent: a worker whose statements
// name a column the database lacks (a migration not applied yet) keeps
// retrying the event past the retry budget (5 retries, 20-40ms apart
// here) instead of dead-lettering it, alerts meanwhile, and settles it
// once the schema is there.
func TestSchemaBehindNeverDeadLettersAnEvent(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{})
	p.user(1, map[string]string{"ETH": "0"})
	_, err := p.sql.Exec(ctx, `ALTER TABLE balances RENAME COLUMN held TO held_later`)
	require.NoError(t, err)
	p.accept("behind-deposit", payment.Deposit, 1, "ETH", "2")

	// One alert a run (the Alerter's cooldown, not used here, spaces them).
	p.waitFor("runs past the retry budget", 20*time.Second, func() bool {
		return p.alerts.count("schema_mismatch") > task.RetryMax+1 || p.alerts.count("dead_letter:") > 0
	})
	require.Zero(t, p.alerts.count("dead_letter:"), "no event dead-lettered for a schema behind")
	require.Zero(t, p.count(`SELECT count(*) FROM dead_letter_queue`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'behind-deposit' AND status = 'enqueued'`))

	_, err = p.sql.Exec(ctx, `ALTER TABLE balances RENAME COLUMN held_later TO held`)
	require.NoError(t, err)
	p.waitFor("the deposit confirmed", 20*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'behind-deposit' AND status = 'confirmed'`) == 1
	})
	require.Equal(t, 1, p.count(`SELECT count(*) FROM balances WHERE user_id = 1 AND asset = 'ETH' AND balance = 2`))
}
