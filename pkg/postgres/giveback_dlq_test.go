package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TestDeadLetteredGiveBack: where the provider's word is the evidence, a
// give-back the ledger dead-lettered still stands (a replay would credit
// it): a re-add of the transfer changes nothing and errs nothing, and a
// removal cancels it with its dead letter, so no replay credits a
// transfer off the chain; the next re-add gives the deposit back again.
func TestDeadLetteredGiveBack(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	const id = "gb-dead"
	backID := payment.ReturnEventID(1, id)
	f.apply(f.transferDeposit(id, 1, "USDC", "10", txA, "5"))

	r, err := f.db.ReverseDeposit(ctx, id, "removed", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Compensating, r)
	f.apply(f.claim(payment.CompensationEventID(id)))
	back, err := f.db.ReturnDeposit(ctx, id, payment.Transfer{}, false, "re-added")
	require.NoError(t, err)
	require.Equal(t, postgres.GivenBack, back)
	letter := f.deadLetter(f.claim(backID), "retries exhausted")
	require.True(t, dec("0").Equal(f.balance(1, "USDC")))

	back, err = f.db.ReturnDeposit(ctx, id, payment.Transfer{}, false, "re-added again")
	require.NoError(t, err, "the give-back stands, dead-lettered")
	require.Equal(t, postgres.NotCompensated, back)

	_, err = f.db.ReverseDeposit(ctx, id, "removed again", "")
	require.NoError(t, err)
	status, outcome := f.status(backID)
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, string(payment.OutcomeReorged), outcome, "cancelled: no replay reopens it")
	entry, err := f.db.DeadLetter(ctx, letter)
	require.NoError(t, err)
	require.Equal(t, "discarded", entry.Resolution)
	require.Equal(t, "settle", entry.ResolvedBy)
	_, err = f.db.ReplayDeadLetter(ctx, letter, "bob", "retry the give-back")
	require.ErrorIs(t, err, postgres.ErrDiscarded)
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed', 'failed')`), "nothing reopened")
	require.True(t, dec("0").Equal(f.balance(1, "USDC")), "the transfer is off the chain")

	back, err = f.db.ReturnDeposit(ctx, id, payment.Transfer{}, false, "re-added a third time")
	require.NoError(t, err)
	require.Equal(t, postgres.GivenBack, back)
	f.apply(f.claim(backID))
	require.True(t, dec("10").Equal(f.balance(1, "USDC")))
	f.requireInvariants()
}
