package intake_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const bob = int64(8)

// bobETH is bob's deposit address: a provider that names it for alice's
// transfer reports the wrong recipient.
const bobETH = "0x0000000000000000000000000000000000000b0b"

// end claims every pending event and has the finality gate end tr's
// deposit failed with outcome, as the worker does.
func (f *fixture) end(tr payment.ReportedTransfer, outcome payment.Outcome) {
	f.t.Helper()
	ctx := context.Background()
	_, err := f.db.ClaimOutbox(ctx, 100, 100, 10)
	require.NoError(f.t, err)
	e := f.event(tr.EventID())
	require.Equal(f.t, payment.StatusEnqueued, e.Status)
	moved, err := f.db.DecideChainOutcome(ctx, payment.Event{ID: e.ID, Type: e.Type, Generation: e.Generation}, outcome, "the chain says otherwise")
	require.NoError(f.t, err)
	require.True(f.t, moved)
}

// TestSupersedeAMismatchedDeposit: a wrong report (amount and recipient)
// that the chain contradicted, then the true one of the same transfer:
// the event takes the true content, reopened under a new generation, and
// its history says what was replaced and by whom.
func TestSupersedeAMismatchedDeposit(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	_, err := f.db.CreateUser(ctx, bob)
	require.NoError(t, err)
	_, err = f.db.AddDepositAddress(ctx, mainnet, bobETH, bob)
	require.NoError(t, err)
	in := f.intake(true)
	wrong := f.transfer(1, bobETH, "5")
	f.deliver(in, wrong)
	f.end(wrong, payment.OutcomeMismatch)
	before := f.event(wrong.EventID())

	truth := f.transfer(1, aliceETH, "1")
	answer := f.deliver(in, truth)
	require.Equal(t, 1, answer.Superseded)
	require.Zero(t, answer.Ignored)
	require.Equal(t, 1, f.counts.get(intake.OutcomeSuperseded, ""))
	e := f.event(truth.EventID())
	require.Equal(t, payment.StatusPending, e.Status, "back to the finality gate")
	require.Equal(t, alice, e.UserID, "the owner of the true recipient")
	require.True(t, decimal.RequireFromString("1").Equal(e.Amount))
	require.Equal(t, before.Generation+1, e.Generation)
	require.Empty(t, e.Outcome)
	history, err := f.db.Rechecks(ctx, truth.EventID())
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, "alchemy", history[0].RequestedBy)
	require.Equal(t, postgres.RecheckReopened, history[0].Result)
	require.True(t, strings.Contains(history[0].Detail, "was 5 ETH to "+bobETH+" of user 8"), history[0].Detail)

	// The same true report again is a duplicate; the wrong one again
	// conflicts with a pending deposit and changes nothing.
	answer = f.deliver(in, truth)
	require.Equal(t, 1, answer.Duplicates)
	require.Zero(t, answer.Superseded)
	answer = f.deliver(in, wrong)
	require.Equal(t, 1, answer.Ignored)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonConflict))
	require.True(t, decimal.RequireFromString("1").Equal(f.event(truth.EventID()).Amount))
}

// TestConflictsThatStayConflicts: a deposit that may still move money
// (pending, enqueued) or failed for another reason than the chain
// contradicting its content is never overwritten, nor by a removal.
func TestConflictsThatStayConflicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state func(f *fixture, tr payment.ReportedTransfer)
	}{
		{"pending", func(*fixture, payment.ReportedTransfer) {}},
		{"enqueued", func(f *fixture, _ payment.ReportedTransfer) {
			_, err := f.db.ClaimOutbox(context.Background(), 100, 100, 10)
			require.NoError(f.t, err)
		}},
		{"failed reverted", func(f *fixture, tr payment.ReportedTransfer) { f.end(tr, payment.OutcomeReverted) }},
		{"failed not_found", func(f *fixture, tr payment.ReportedTransfer) { f.end(tr, payment.OutcomeNotFound) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			in := f.intake(true)
			stored := f.transfer(1, aliceETH, "5")
			f.deliver(in, stored)
			tc.state(f, stored)
			before := f.event(stored.EventID())

			other := f.transfer(1, aliceETH, "1")
			answer := f.deliver(in, other)
			require.Equal(t, 1, answer.Ignored)
			require.Zero(t, answer.Superseded)
			require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonConflict))
			after := f.event(stored.EventID())
			require.Equal(t, before.Status, after.Status)
			require.Equal(t, before.Generation, after.Generation)
			require.True(t, before.Amount.Equal(after.Amount), "nothing overwritten")
		})
	}

	t.Run("removed report of a mismatch", func(t *testing.T) {
		f := setup(t)
		in := f.intake(true)
		stored := f.transfer(1, aliceETH, "5")
		f.deliver(in, stored)
		f.end(stored, payment.OutcomeMismatch)
		removed := f.transfer(1, aliceETH, "1")
		removed.Removed, removed.Reorged = true, true
		answer := f.deliver(in, removed)
		require.Zero(t, answer.Superseded, "a removal is no evidence of content")
		require.Equal(t, payment.StatusFailed, f.event(stored.EventID()).Status)
	})
}
