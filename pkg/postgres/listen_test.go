package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestListenOnAFrozenDatabaseGoesOn: a PostgreSQL that stops answering
// without a reset (a failover, a partition) fails the listener's connect,
// its self-check or its quiet wait at their bounds, and it reconnects,
// instead of waiting until the kernel gives the socket up (wake-ups left
// to the poll meanwhile).
func TestListenOnAFrozenDatabaseGoesOn(t *testing.T) {
	const bound = 200 * time.Millisecond
	// run listens through a freezer; freezeAt is called with the freezer
	// and the number of wake-ups so far, on every wake-up and once before.
	run := func(t *testing.T, freezeAt func(f *testenv.Freezer, wakes int32)) (errs *atomic.Int32) {
		freezer, dsn := testenv.NewFreezer(t, testenv.DatabaseURL(t))
		errs = new(atomic.Int32)
		var wakes atomic.Int32
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); freezer.Thaw(); <-done })
		freezeAt(freezer, 0)
		go func() {
			defer close(done)
			postgres.ListenWithin(ctx, dsn, postgres.OutboxChannel, func() { freezeAt(freezer, wakes.Add(1)) },
				func(error) { errs.Add(1) }, bound, bound, time.Hour)
		}()
		return errs
	}
	failsWithinBounds := func(t *testing.T, errs *atomic.Int32, what string) {
		require.Eventually(t, func() bool { return errs.Load() > 0 }, 25*bound, 10*time.Millisecond,
			"the listener's %s still waits on a frozen PostgreSQL (its bound is %s)", what, bound)
	}

	t.Run("connect", func(t *testing.T) {
		errs := run(t, func(f *testenv.Freezer, wakes int32) {
			if wakes == 0 {
				f.Freeze() // the DSN has no connect_timeout
			}
		})
		failsWithinBounds(t, errs, "connect")
	})
	t.Run("self-check", func(t *testing.T) {
		errs := run(t, func(f *testenv.Freezer, wakes int32) {
			if wakes == 1 {
				f.Freeze() // LISTEN is done, the self-check comes next
			}
		})
		failsWithinBounds(t, errs, "self-check")
	})
}

// TestListenOnAFrozenQuietSessionGoesOn: a session that hears nothing
// for its quiet bound makes sure PostgreSQL still answers; a frozen one
// is given up and the listener reconnects.
func TestListenOnAFrozenQuietSessionGoesOn(t *testing.T) {
	const bound = 200 * time.Millisecond
	direct := testenv.DatabaseURL(t)
	freezer, dsn := testenv.NewFreezer(t, direct)
	var errs, wakes atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); freezer.Thaw(); <-done })
	go func() {
		defer close(done)
		postgres.ListenWithin(ctx, dsn, postgres.OutboxChannel, func() { wakes.Add(1) }, func(error) { errs.Add(1) }, bound, bound, bound)
	}()
	require.Eventually(t, func() bool { return wakes.Load() > 0 }, 5*time.Second, 10*time.Millisecond)
	// A second wake-up comes from the waiting loop, the self-check done.
	conn, err := pgx.Connect(ctx, direct)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT pg_notify($1, 'test')", postgres.OutboxChannel)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return wakes.Load() > 1 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(3 * bound) // quiet: the session's own look must pass
	require.Zero(t, errs.Load(), "a quiet, healthy session was given up")

	freezer.Freeze()
	require.Eventually(t, func() bool { return errs.Load() > 0 }, 25*bound, 10*time.Millisecond,
		"the quiet listener still waits on a frozen PostgreSQL (its bound is %s)", bound)
}
