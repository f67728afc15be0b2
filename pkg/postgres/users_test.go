package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// TestInitialBalanceRacingACreditKeepsIt: the initial balance is set while
// a credit of the same balance is in flight (the ledger holds the balance
// row and has not written its journal yet, so the set's journal check
// cannot see it). The credit must survive: balance = initial + journal.
func TestInitialBalanceRacingACreditKeepsIt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, existing := range []bool{false, true} {
		user := int64(1)
		if existing {
			user = 2
		}
		f.user(user, nil)
		if existing {
			require.NoError(t, f.db.SetInitialBalance(ctx, user, "ETH", dec("2")))
		}
		task := f.enqueue("race-credit-"+map[bool]string{false: "new", true: "existing"}[existing], payment.Deposit, user, "ETH", "1")

		// Hold the event's row, so the ledger stops after it locked the
		// balance and before it writes the journal.
		holder, err := pgx.Connect(ctx, f.dsn)
		require.NoError(t, err)
		hold, err := holder.Begin(ctx)
		require.NoError(t, err)
		_, err = hold.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, task.ID)
		require.NoError(t, err)

		credited := make(chan error, 1)
		go func() {
			_, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{LockTimeout: 10 * time.Second, StatementTimeout: 20 * time.Second})
			credited <- err
		}()
		f.waitForLockWaiters(1)
		set := make(chan error, 1)
		go func() { set <- f.db.SetInitialBalance(ctx, user, "ETH", dec("5")) }()
		f.waitForLockWaiters(2)
		require.NoError(t, hold.Commit(ctx))
		holder.Close(ctx)
		require.NoError(t, <-credited)
		require.NoError(t, <-set, "the journal was empty when the set began")

		var balance, initial string
		require.NoError(t, f.sql.QueryRow(ctx, `SELECT balance::text, initial_balance::text FROM balances WHERE user_id = $1 AND asset = 'ETH'`, user).Scan(&balance, &initial))
		require.True(t, dec(initial).Equal(dec("5")), "existing row %v: initial %s", existing, initial)
		require.True(t, dec(balance).Equal(dec("6")), "existing row %v: the credit survived (balance %s)", existing, balance)
		require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE user_id = $1`, user))
		f.requireJournalInvariant()
	}
}

// waitForLockWaiters waits until n sessions of this database wait for a
// lock.
func (f *fixture) waitForLockWaiters(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		waiting := f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		if waiting >= n {
			return
		}
		require.True(f.t, time.Now().Before(deadline), "%d sessions wait for a lock, want %d", waiting, n)
		time.Sleep(10 * time.Millisecond)
	}
}
