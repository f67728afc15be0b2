package intake_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// applyMeanwhile runs a worker that applies the outbox, one event a
// transaction, until the returned function stops it (and waits for it);
// its errors go to errs.
func (f *fixture) applyMeanwhile(errs chan<- error) (stop func()) {
	ctx := context.Background()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			claimed, err := f.db.ClaimOutbox(ctx, 50, 0, postgres.TaskEventsMax)
			if err != nil {
				errs <- err
				return
			}
			for _, c := range claimed {
				if _, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// store delivers one report through in, as its own delivery.
func store(in *intake.Intake, report payment.ReportedTransfer) error {
	return in.Start(provider, "trace-race").Store(context.Background(), []payment.ReportedTransfer{report})
}

// requireNoErrors closes errs and fails on any error in it.
func requireNoErrors(t *testing.T, errs chan error) {
	t.Helper()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func (f *fixture) balance() decimal.Decimal {
	f.t.Helper()
	balances, err := f.db.Balances(context.Background(), alice)
	require.NoError(f.t, err)
	for _, b := range balances {
		if b.Asset == f.eth.Code {
			return b.Balance
		}
	}
	return decimal.Zero
}

// TestRemovedAndAddedBackWithoutAChain: where the provider's word is the
// evidence, a credited deposit it reports removed is compensated, and
// reported again it is given back; each report is applied once however
// often it comes, cycle after cycle, until ReorgCyclesMax, after which
// the deposit stays compensated. The balance, the journal and the
// invariants agree at every step.
func TestRemovedAndAddedBackWithoutAChain(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(in, tr)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, payment.StatusConfirmed, f.event(tr.EventID()).Status)
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))
	removed := tr
	removed.Removed = true

	rows := 1
	for cycle := 1; cycle <= payment.ReorgCyclesMax; cycle++ {
		answer := f.deliver(in, removed, removed)
		require.Equal(t, 2, answer.Reversed, "cycle %d", cycle)
		testenv.SettleOutbox(t, f.db)
		require.True(t, decimal.Zero.Equal(f.balance()), "cycle %d: the removal is compensated once", cycle)
		rows++
		compensation := f.event(payment.CycleCompensationEventID(cycle, tr.EventID()))
		require.Equal(t, payment.StatusConfirmed, compensation.Status)
		require.Equal(t, payment.ReorgCompensation, compensation.Type)

		answer = f.deliver(in, tr, tr)
		testenv.SettleOutbox(t, f.db)
		if cycle == payment.ReorgCyclesMax {
			require.Equal(t, 0, answer.Reopened, "the last compensation is not given back")
			require.True(t, decimal.Zero.Equal(f.balance()))
			_, err := f.db.Event(context.Background(), payment.ReturnEventID(cycle, tr.EventID()))
			require.ErrorIs(t, err, payment.ErrNotFound)
			break
		}
		require.Equal(t, 1, answer.Reopened, "cycle %d: given back once", cycle)
		require.True(t, decimal.NewFromInt(1).Equal(f.balance()), "cycle %d: reported again, the deposit is given back once", cycle)
		rows++
		back := f.event(payment.ReturnEventID(cycle, tr.EventID()))
		require.Equal(t, payment.StatusConfirmed, back.Status)
		require.Equal(t, payment.Deposit, back.Type)
		require.Empty(t, back.TxHash, "the give-back claims no transfer: the deposit keeps its claim")
		testenv.RequireInvariants(t, f.db)
	}
	journal := 0
	for cycle := 1; cycle <= payment.ReorgCyclesMax; cycle++ {
		for _, id := range []string{payment.CycleCompensationEventID(cycle, tr.EventID()), payment.ReturnEventID(cycle, tr.EventID())} {
			if e, err := f.db.Event(context.Background(), id); err == nil {
				require.Equal(t, payment.StatusConfirmed, e.Status)
				journal++
			}
		}
	}
	require.Equal(t, rows, journal+1, "the credit, and each compensation and give-back once")
	testenv.RequireInvariants(t, f.db)
}

// TestRemovalsAndReaddsRacing: removals and re-adds of one credited
// deposit race from separate connections while a ledger applies what
// they enter. Whatever the order, the deposit's compensations and
// give-backs alternate (one more compensation exactly when it is off the
// chain in the books), its balance is what that says, and the invariants
// hold.
func TestRemovalsAndReaddsRacing(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(in, tr)
	testenv.SettleOutbox(t, f.db)
	removed := tr
	removed.Removed = true

	const racers, rounds = 4, 3
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, racers*rounds*2+1)
	stopLedger := f.applyMeanwhile(errs)
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				report := tr
				if (r+i)%2 == 0 {
					report = removed
				}
				if err := store(in, report); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	stopLedger()
	requireNoErrors(t, errs)
	testenv.SettleOutbox(t, f.db)

	// Compensation n exists only once give-back n-1 was credited; the
	// last give-back, voided (failed) if its transfer left again before
	// it was credited, says whether the deposit is on the chain.
	comps, back, voided, cancelled := 0, 0, 0, 0
	onChain := true
	for cycle := 1; cycle <= payment.ReorgCyclesMax; cycle++ {
		if c, err := f.db.Event(ctx, payment.CycleCompensationEventID(cycle, tr.EventID())); err == nil {
			require.Equal(t, comps, back, "compensation %d follows give-back %d", cycle, cycle-1)
			comps++
			onChain = false
			if c.Status == payment.StatusFailed {
				// Cancelled: the transfer came back before the ledger
				// applied it (a loaded machine's order). Nothing was
				// taken, so the deposit is on the chain, and no
				// give-back or later compensation can follow it.
				require.Equal(t, string(payment.OutcomeReorged), c.Outcome)
				onChain = true
				cancelled++
			} else {
				require.Equal(t, payment.StatusConfirmed, c.Status)
			}
		}
		if r, err := f.db.Event(ctx, payment.ReturnEventID(cycle, tr.EventID())); err == nil {
			require.Zero(t, cancelled, "a give-back of a compensation never applied")
			require.Equal(t, comps, back+1, "give-back %d follows compensation %d", cycle, cycle)
			back++
			onChain = r.Status == payment.StatusConfirmed
			if r.Status == payment.StatusFailed {
				require.Equal(t, string(payment.OutcomeReorged), r.Outcome)
				require.Equal(t, cycle, comps, "only the last give-back can be voided: a later compensation needs it credited")
				voided++
			} else {
				require.Equal(t, payment.StatusConfirmed, r.Status)
			}
		}
	}
	require.Positive(t, comps, "some removal won")
	want := decimal.Zero
	if onChain {
		want = decimal.NewFromInt(1)
	}
	require.True(t, want.Equal(f.balance()), "%d compensations (%d cancelled), %d give-backs (%d voided), balance %s", comps, cancelled, back, voided, f.balance())
	testenv.RequireInvariants(t, f.db)
	t.Logf("%d compensations (%d cancelled), %d give-backs (%d voided)", comps, cancelled, back, voided)
}

// TestGiveBackVoidedThenReopened: a removal that arrives while the
// give-back is still in the outbox voids it rather than compensating a
// credit not made; the transfer back once more reopens the same
// give-back, which the ledger then credits once.
func TestGiveBackVoidedThenReopened(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	ctx := context.Background()
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(in, tr)
	testenv.SettleOutbox(t, f.db)
	removed := tr
	removed.Removed = true
	back := payment.ReturnEventID(1, tr.EventID())

	f.deliver(in, removed)
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(f.balance()))
	require.Equal(t, 1, f.deliver(in, tr).Reopened)
	require.Equal(t, payment.StatusPending, f.event(back).Status)

	require.Equal(t, 1, f.deliver(in, removed).Reversed)
	e := f.event(back)
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)
	_, err := f.db.Event(ctx, payment.CycleCompensationEventID(2, tr.EventID()))
	require.ErrorIs(t, err, payment.ErrNotFound, "no compensation of a give-back never credited")
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(f.balance()))

	require.Equal(t, 1, f.deliver(in, tr).Reopened)
	require.Equal(t, payment.StatusPending, f.event(back).Status)
	require.Equal(t, 0, f.deliver(in, tr).Reopened, "reopened once")
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, payment.StatusConfirmed, f.event(back).Status)
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))
	testenv.RequireInvariants(t, f.db)

	// And taken again, now that it is credited: compensation 2.
	require.Equal(t, 1, f.deliver(in, removed).Reversed)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, payment.StatusConfirmed, f.event(payment.CycleCompensationEventID(2, tr.EventID())).Status)
	require.True(t, decimal.Zero.Equal(f.balance()))
	testenv.RequireInvariants(t, f.db)
}

// TestProviderReportGivesBackADepositNamedByPayments: where the chain can
// be asked, a provider's report of a transfer whose claim a compensated
// /webhook/payments deposit holds is stored under the transfer's own id,
// and the deposit holding the claim is watched again (the watcher gives
// it back once final).
func TestProviderReportGivesBackADepositNamedByPayments(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	tr := f.transfer(1, aliceETH, "1")
	_, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{
		ID: "pay-1", Type: payment.Deposit, UserID: alice, Asset: f.eth.Code, Amount: decimal.NewFromInt(1),
		TxHash: tr.TxHash, TraceID: "trace-pay-1", Network: mainnet,
	}, Source: postgres.SourcePayments})
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event, Chain: &postgres.ChainEvidence{
		BlockNumber: 7, BlockHash: fmt.Sprintf("0x%064x", 7), Watch: true, Transfers: []string{payment.TransferNative},
	}}}, postgres.LedgerOptions{})
	require.NoError(t, err)
	_, err = f.db.ReverseDeposit(ctx, "pay-1", "block 7 replaced", "")
	require.NoError(t, err)
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(f.balance()))

	answer := f.deliver(f.intake(true), tr)
	require.Equal(t, 1, answer.Accepted)
	require.Equal(t, 1, answer.Reopened)
	e, err := f.db.Event(ctx, "pay-1")
	require.NoError(t, err)
	require.Equal(t, "watching", e.ChainState)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, string(payment.OutcomeDuplicateTransfer), f.event(tr.EventID()).Outcome)
	testenv.RequireInvariants(t, f.db)
}

// TestGiveBackOfACompensationNeverApplied: a compensation the ledger
// could not apply (the deposit was held for a withdrawal, so the user's
// available balance did not cover it) or had not applied yet took
// nothing; when the transfer comes back it is cancelled, never answered
// with a give-back credit, and its dead letter is discarded so no replay
// takes the deposit back. When the transfer leaves again the same
// compensation runs once more.
func TestGiveBackOfACompensationNeverApplied(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	provider := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	removed := tr
	removed.Removed = true
	compID := payment.CompensationEventID(tr.EventID())
	f.deliver(provider, tr)
	testenv.SettleOutbox(t, f.db)

	// Dead-lettered: the deposit is held for a withdrawal.
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "hold-1", Type: payment.WithdrawalHold, UserID: alice,
		Asset: f.eth.Code, Amount: decimal.NewFromInt(1), Network: mainnet, ToAddress: stranger, TraceID: "trace-hold"}, Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, 1, f.deliver(provider, removed).Reversed)
	testenv.SettleOutbox(t, f.db)
	comp := f.event(compID)
	require.Equal(t, payment.StatusFailed, comp.Status)
	require.Equal(t, string(payment.OutcomeDeadLettered), comp.Outcome)
	f.requireBalance(1, "the compensation could not be applied")

	require.Equal(t, 1, f.deliver(provider, tr).Reopened)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(1, "back on the chain: nothing to give back")
	_, err = f.db.Event(ctx, payment.ReturnEventID(1, tr.EventID()))
	require.ErrorIs(t, err, payment.ErrNotFound, "no give-back credit")
	comp = f.event(compID)
	require.Equal(t, payment.StatusFailed, comp.Status)
	require.Equal(t, string(payment.OutcomeReorged), comp.Outcome, "cancelled")
	letters, err := f.db.DeadLetters(ctx, "open", 0, 10)
	require.NoError(t, err)
	require.Empty(t, letters, "its dead letter is discarded")
	all, err := f.db.DeadLetters(ctx, "all", 0, 10)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, "discarded", all[0].Resolution)
	replayed, err := f.db.ReplayDeadLetter(ctx, all[0].ID, "ops", "try")
	require.ErrorIs(t, err, postgres.ErrDiscarded, "%v", replayed)
	require.Zero(t, f.deliver(provider, tr).Reopened, "reported again: on the chain already")
	testenv.RequireInvariants(t, f.db)

	// The transfer leaves again, and the hold is released meanwhile: the
	// same compensation runs and now applies.
	inserted, err = f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "void-1", Type: payment.WithdrawalVoid, UserID: alice,
		Asset: f.eth.Code, Amount: decimal.NewFromInt(1), HoldID: "hold-1", TraceID: "trace-void"}, Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, 1, f.deliver(provider, removed).Reversed)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, payment.StatusConfirmed, f.event(compID).Status)
	f.requireBalance(0, "compensated")
	testenv.RequireInvariants(t, f.db)

	// Not applied yet: back before the worker ran it.
	tr2 := f.transfer(2, aliceETH, "2")
	removed2 := tr2
	removed2.Removed = true
	f.deliver(provider, tr2)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(2, "the second deposit")
	require.Equal(t, 1, f.deliver(provider, removed2).Reversed)
	require.Equal(t, 1, f.deliver(provider, tr2).Reopened)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(2, "a compensation voided before it ran takes nothing, and nothing is given back")
	comp2 := f.event(payment.CompensationEventID(tr2.EventID()))
	require.Equal(t, payment.StatusFailed, comp2.Status)
	require.Equal(t, string(payment.OutcomeReorged), comp2.Outcome)
	_, err = f.db.Event(ctx, payment.ReturnEventID(1, tr2.EventID()))
	require.ErrorIs(t, err, payment.ErrNotFound)

	// A full cycle after it: compensated, then given back by a credit.
	require.Equal(t, 1, f.deliver(provider, removed2).Reversed)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(0, "compensated at last")
	require.Equal(t, 1, f.deliver(provider, tr2).Reopened)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(2, "given back")
	require.Equal(t, payment.StatusConfirmed, f.event(payment.ReturnEventID(1, tr2.EventID())).Status)
	testenv.RequireInvariants(t, f.db)
}
