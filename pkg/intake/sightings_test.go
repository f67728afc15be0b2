package intake_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

func blockHash(n int) string { return fmt.Sprintf("0x%064x", 0xb10c000+n) }

// in reports tr as a provider that names its block does: in block n,
// removed or not.
func in(tr payment.ReportedTransfer, n int, removed bool) payment.ReportedTransfer {
	tr.BlockHash, tr.Removed = blockHash(n), removed
	return tr
}

func (f *fixture) requireBalance(want int64, msg string) {
	f.t.Helper()
	require.True(f.t, decimal.NewFromInt(want).Equal(f.balance()), "%s: balance %s, want %d", msg, f.balance(), want)
}

func (f *fixture) sightings(id string) int {
	f.t.Helper()
	s, err := f.db.EventSightings(context.Background(), id)
	require.NoError(f.t, err)
	return len(s)
}

// TestRemovalDeliveredAfterTheReadd: without an RPC, a transfer a reorg
// moved from block 1 to block 2 is reported in block 2 before its removal
// from block 1 arrives (the removal's first delivery failed and was
// retried). The late removal reverses nothing: the transfer is still
// reported in a block not removed. Its removal from block 2 then does.
func TestRemovalDeliveredAfterTheReadd(t *testing.T) {
	f := setup(t)
	provider := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(provider, in(tr, 1, false))
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(1, "credited")

	answer := f.deliver(provider, in(tr, 2, false))
	require.Equal(t, 1, answer.Duplicates)
	answer = f.deliver(provider, in(tr, 1, true), in(tr, 1, true))
	require.Zero(t, answer.Reversed, "the transfer is reported in block 2")
	require.Equal(t, 2, f.counts.get(intake.OutcomeIgnored, intake.ReasonRemovedSeenElsewhere))
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(1, "a late removal of block 1")
	_, err := f.db.Event(context.Background(), payment.CycleCompensationEventID(1, tr.EventID()))
	require.ErrorIs(t, err, payment.ErrNotFound, "no compensation")

	// Every report again, in another order: nothing changes.
	f.deliver(provider, in(tr, 1, true), in(tr, 2, false), in(tr, 1, false))
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(1, "redeliveries")

	answer = f.deliver(provider, in(tr, 2, true))
	require.Equal(t, 1, answer.Reversed, "no block left")
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(0, "removed from block 2 too")
	require.Equal(t, 2, f.sightings(tr.EventID()))
	testenv.RequireInvariants(t, f.db)
}

// TestAddDeliveredAfterItsRemoval: a report of a transfer in a block its
// provider reported removed is a stale redelivery: it neither gives back
// the compensated deposit nor reopens one that failed reorged. Reported
// in a new block, it does.
func TestAddDeliveredAfterItsRemoval(t *testing.T) {
	f := setup(t)
	provider := f.intake(false)

	// Credited, then compensated.
	credited := f.transfer(1, aliceETH, "1")
	f.deliver(provider, in(credited, 1, false))
	testenv.SettleOutbox(t, f.db)
	answer := f.deliver(provider, in(credited, 1, true))
	require.Equal(t, 1, answer.Reversed)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(0, "compensated")
	answer = f.deliver(provider, in(credited, 1, false))
	require.Zero(t, answer.Reopened, "block 1 was removed")
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(0, "a stale add gives nothing back")
	answer = f.deliver(provider, in(credited, 2, false))
	require.Equal(t, 1, answer.Reopened)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(1, "given back for block 2")
	require.Equal(t, payment.StatusConfirmed, f.event(payment.ReturnEventID(1, credited.EventID())).Status)

	// Not credited yet, then failed reorged.
	pending := f.transfer(2, aliceETH, "2")
	f.deliver(provider, in(pending, 1, false))
	answer = f.deliver(provider, in(pending, 1, true))
	require.Equal(t, 1, answer.Reversed)
	e := f.event(pending.EventID())
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)
	answer = f.deliver(provider, in(pending, 1, false))
	require.Zero(t, answer.Reopened)
	require.Equal(t, payment.StatusFailed, f.event(pending.EventID()).Status, "a stale add reopens nothing")
	answer = f.deliver(provider, in(pending, 3, false))
	require.Equal(t, 1, answer.Reopened)
	testenv.SettleOutbox(t, f.db)
	require.Equal(t, payment.StatusConfirmed, f.event(pending.EventID()).Status)
	f.requireBalance(3, "reopened and credited for block 3")
	testenv.RequireInvariants(t, f.db)
}

// TestRemovalBeforeTheFirstReport: a removal that arrives before any
// report of its transfer is kept; the transfer's report in that block,
// when it comes, is stored and failed reorged at once, never credited.
func TestRemovalBeforeTheFirstReport(t *testing.T) {
	f := setup(t)
	provider := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	answer := f.deliver(provider, in(tr, 1, true))
	require.Equal(t, 1, answer.Ignored)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonRemovedUnknown))
	require.Equal(t, 1, f.sightings(tr.EventID()), "kept for the report to come")

	answer = f.deliver(provider, in(tr, 1, false))
	require.Equal(t, 1, answer.Accepted)
	require.Equal(t, 1, answer.Reversed)
	testenv.SettleOutbox(t, f.db)
	e := f.event(tr.EventID())
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)
	f.requireBalance(0, "never credited")

	// A removal to an address that is no deposit address keeps nothing.
	other := f.transfer(2, stranger, "1")
	f.deliver(provider, in(other, 1, true))
	require.Zero(t, f.sightings(other.EventID()))
	testenv.RequireInvariants(t, f.db)
}

// TestBlocksIgnoredWithAChain: where the chain can be asked it decides;
// no report's block is kept, and a report that names none (a provider
// without block hashes) is judged as before.
func TestBlocksIgnoredWithAChain(t *testing.T) {
	f := setup(t)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(f.intake(true), in(tr, 1, false))
	f.deliver(f.intake(true), in(tr, 1, true))
	require.Zero(t, f.sightings(tr.EventID()))

	plain := f.transfer(2, aliceETH, "1")
	provider := f.intake(false)
	f.deliver(provider, plain)
	testenv.SettleOutbox(t, f.db)
	removed := plain
	removed.Removed = true
	require.Equal(t, 1, f.deliver(provider, removed).Reversed)
	require.Zero(t, f.sightings(plain.EventID()))
}

// TestSightingsRacing: every report of a transfer's history, delivered
// again and again by racing deliveries in shuffled orders while a worker
// applies the outbox, ends where the history does: on the chain (a last
// block not removed) credited once, off it compensated, whichever report
// decided last.
func TestSightingsRacing(t *testing.T) {
	for _, c := range []struct {
		name    string
		reports func(tr payment.ReportedTransfer) []payment.ReportedTransfer
		want    int64
	}{
		{"moved to block 2", func(tr payment.ReportedTransfer) []payment.ReportedTransfer {
			return []payment.ReportedTransfer{in(tr, 1, false), in(tr, 1, true), in(tr, 2, false)}
		}, 1},
		{"moved, then gone", func(tr payment.ReportedTransfer) []payment.ReportedTransfer {
			return []payment.ReportedTransfer{in(tr, 1, false), in(tr, 1, true), in(tr, 2, false), in(tr, 2, true)}
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := setup(t)
			provider := f.intake(false)
			tr := f.transfer(1, aliceETH, "1")
			reports := c.reports(tr)
			errs := make(chan error, 64)
			stopLedger := f.applyMeanwhile(errs)
			var racers sync.WaitGroup
			for r := range 4 {
				racers.Add(1)
				go func() {
					defer racers.Done()
					rng := rand.New(rand.NewPCG(uint64(r), 7))
					for range 3 {
						order := append([]payment.ReportedTransfer(nil), reports...)
						rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
						for _, report := range order {
							if err := store(provider, report); err != nil {
								errs <- err
							}
						}
					}
				}()
			}
			racers.Wait()
			stopLedger()
			requireNoErrors(t, errs)
			testenv.SettleOutbox(t, f.db)
			f.requireBalance(c.want, c.name)
			testenv.RequireInvariants(t, f.db)
		})
	}
}

// TestFirstReportsRacing: a transfer's first report and its removal from
// the same block, delivered at the same moment, many times over: however
// they interleave (the removal looking for the deposit just before the
// report stores it), no deposit stays credited.
func TestFirstReportsRacing(t *testing.T) {
	f := setup(t)
	provider := f.intake(false)
	const transfers = 300
	errs := make(chan error, 2*transfers)
	for n := range transfers {
		tr := f.transfer(1000+n, aliceETH, "1")
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, report := range []payment.ReportedTransfer{in(tr, 1, false), in(tr, 1, true)} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := store(provider, report); err != nil {
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
	}
	requireNoErrors(t, errs)
	testenv.SettleOutbox(t, f.db)
	f.requireBalance(0, "every transfer was removed")
	testenv.RequireInvariants(t, f.db)
}
