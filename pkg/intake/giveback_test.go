package intake_test

import (
	"context"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

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
