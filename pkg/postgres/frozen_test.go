package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// frozenMidTransaction sets up the frozen-replica tests: run, on a
// database behind a freezer, blocks on a row lock the test holds in
// holder; the link is frozen there and holder lets go, so run's
// transaction sits open with its locks, its client silent. Thaw the
// returned freezer to let run answer on the channel.
func (f *fixture) frozenMidTransaction(t *testing.T, holder pgx.Tx, run func(replica *postgres.DB) error) (*testenv.Freezer, <-chan error) {
	t.Helper()
	ctx := context.Background()
	freezer, dsn := testenv.NewFreezer(t, f.dsn)
	replica := testenv.OpenDB(t, dsn)
	// Registered after the pool's Close, so it runs before it: Close
	// waits for run.
	t.Cleanup(freezer.Thaw)
	require.NoError(t, replica.Ping(ctx))
	done := make(chan error, 1)
	go func() { done <- run(replica) }()
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_locks WHERE NOT granted`) > 0
	}, 5*time.Second, 5*time.Millisecond)
	freezer.Freeze()
	require.NoError(t, holder.Rollback(ctx))
	return freezer, done
}

// requireEndedWhileFrozen thaws the link and requires the frozen call to
// answer unavailable: PostgreSQL ended its session, nothing was stored.
func requireEndedWhileFrozen(t *testing.T, freezer *testenv.Freezer, done <-chan error) {
	t.Helper()
	freezer.Thaw()
	select {
	case err := <-done:
		require.ErrorIs(t, err, payment.ErrUnavailable, "the frozen transaction was ended, not stored")
	case <-time.After(10 * time.Second):
		t.Fatal("the frozen replica never returned after the thaw")
	}
}

// requireAppliedWithin applies ev through the fixture's own database,
// asking again until it is applied or 15 s have passed.
func (f *fixture) requireAppliedWithin(t *testing.T, ev payment.Event, what string) {
	t.Helper()
	var last error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		results, err := f.db.ApplyBatch(context.Background(), []postgres.LedgerItem{{Event: ev}}, postgres.LedgerOptions{})
		if err == nil && results[0].Kind == postgres.Applied {
			return
		}
		last = err
	}
	t.Fatalf("%s never applied while the other is frozen: %v", what, last)
}

// TestRollbackOnAFrozenLinkEnds: a transaction whose link freezes after
// its last statement is rolled back within rollbackTimeout (the
// connection closed), not held until TCP gives up: the scan pass's guard
// freezes the link and reports the lease lost.
func TestRollbackOnAFrozenLinkEnds(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	freezer, dsn := testenv.NewFreezer(t, f.dsn)
	replica := testenv.OpenDB(t, dsn)
	t.Cleanup(freezer.Thaw) // runs before the pool's Close
	require.NoError(t, replica.Ping(ctx))
	done := make(chan error, 1)
	go func() {
		_, err := replica.InPass(ctx, nil, func(pgx.Tx) (bool, error) {
			freezer.Freeze()
			return false, nil
		})
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, postgres.ErrLeaseLost)
	case <-time.After(15 * time.Second):
		t.Fatal("the rollback on a frozen link has not returned in 15 s")
	}
}
