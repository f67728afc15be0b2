package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestScanPassesTakeLocksInOneOrder: a cursor pass and a rescan pass (or
// a webhook batch) storing the same transfers, found in other orders,
// both commit: no deadlock (40P01), every deposit stored once. The
// interleaving that deadlocked is forced: another session holds the row
// of a reorged deposit the cursor pass reopens, so the pass stops there
// holding what it stored before, while the other one takes its own
// first rows and then waits for the pass; then the row is let go.
func TestScanPassesTakeLocksInOneOrder(t *testing.T) {
	const network = "ETH_MAINNET"
	tokenDeposit := func(tx string, index uint64) postgres.NewEvent {
		tr := payment.Transfer{Network: network, TxHash: tx, Index: payment.LogIndexTransfer(index)}
		return postgres.NewEvent{Event: payment.Event{ID: tr.EventID(), Type: payment.Deposit, UserID: 1, Asset: "USDC",
			Amount: decimal.RequireFromString("10"), TxHash: tx, TransferIndex: tr.Index, Network: network},
			Source: postgres.SourceScanner, ToAddress: "0x" + strings.Repeat("44", 20)}
	}
	// setup makes the deposit the cursor pass stops at: reorged, its id
	// after every other one.
	setup := func(t *testing.T) (*fixture, postgres.NewEvent) {
		f := newFixture(t)
		f.user(1, nil)
		ctx := context.Background()
		require.NoError(t, f.db.InitScanCursor(ctx, network, 100))
		_, err := f.db.CreateRescan(ctx, "r-lock", network, 10, 99, "op")
		require.NoError(t, err)
		stop := scannedDeposit(0xff)
		claim, ok, err := f.db.ClaimScanCursor(ctx, network, "setup", time.Minute, 10, 1000)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = f.db.CompleteScanPass(ctx, network, "setup", claim, []postgres.NewEvent{stop})
		require.NoError(t, err)
		_, err = f.sql.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'reorged', chain_state = 'reorged' WHERE event_id = $1`, stop.Event.ID)
		require.NoError(t, err)
		return f, stop
	}
	// race runs the cursor pass (its events, stopped at the row of event
	// held, which another session holds), then other once the pass waits;
	// then lets the row go once other waits too (or ended). It answers
	// both passes' results.
	race := func(t *testing.T, f *fixture, held string, cursor []postgres.NewEvent, other func() error) ([]postgres.StoredDeposit, error, error) {
		ctx := context.Background()
		hold, err := pgx.Connect(ctx, f.dsn)
		require.NoError(t, err)
		defer hold.Close(ctx)
		watch, err := pgx.Connect(ctx, f.dsn)
		require.NoError(t, err)
		defer watch.Close(ctx)
		tx, err := hold.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, held)
		require.NoError(t, err)
		waiting := func(n int, done <-chan struct{}) {
			t.Helper()
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				select {
				case <-done:
					return
				default:
				}
				var w int
				require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&w))
				if w >= n {
					return
				}
			}
			t.Fatalf("never %d sessions waiting for a lock", n)
		}
		claim, ok, err := f.db.ClaimScanCursor(ctx, network, "a", time.Minute, 10, 1000)
		require.NoError(t, err)
		require.True(t, ok)
		var stored []postgres.StoredDeposit
		var cursorErr, otherErr error
		cursorDone, otherDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(cursorDone)
			stored, cursorErr = f.db.CompleteScanPass(ctx, network, "a", claim, cursor)
		}()
		waiting(1, cursorDone)
		go func() {
			defer close(otherDone)
			otherErr = other()
		}()
		waiting(2, otherDone)
		require.NoError(t, tx.Rollback(ctx))
		for _, done := range []chan struct{}{cursorDone, otherDone} {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("a pass never ended")
			}
		}
		return stored, cursorErr, otherErr
	}
	rescan := func(f *fixture, events []postgres.NewEvent, stored *[]postgres.StoredDeposit) func() error {
		return func() error {
			ctx := context.Background()
			if _, ok, err := f.db.ClaimRescan(ctx, network, 1000, "a", time.Minute); err != nil || !ok {
				return fmt.Errorf("rescan claim: %t, %w", ok, err)
			}
			var err error
			*stored, err = f.db.CompleteRescanPass(ctx, "r-lock", "a", 10, 29, "", 128, events)
			return err
		}
	}
	once := func(t *testing.T, f *fixture, events ...postgres.NewEvent) {
		t.Helper()
		for _, e := range events {
			require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = $1`, e.Event.ID), e.Event.ID)
		}
	}

	// The same two new deposits, found in the opposite order: token logs
	// first in one pass, the native coin first in the other (or windows
	// and chunks cut differently).
	t.Run("same deposits", func(t *testing.T) {
		f, stop := setup(t)
		first, second := scannedDeposit(1), scannedDeposit(2)
		var rescanned []postgres.StoredDeposit
		stored, cursorErr, rescanErr := race(t, f, stop.Event.ID, []postgres.NewEvent{first, stop, second},
			rescan(f, []postgres.NewEvent{second, first}, &rescanned))
		require.NoError(t, cursorErr, "cursor pass")
		require.NoError(t, rescanErr, "rescan pass")
		once(t, f, first, second)
		require.Len(t, stored, 3)
		require.Len(t, rescanned, 2)
		require.True(t, stored[1].Reopened)
		require.True(t, stored[0].Inserted != rescanned[1].Inserted, "one pass stored deposit 1: %+v %+v", stored, rescanned)
		require.True(t, stored[2].Inserted != rescanned[0].Inserted, "one pass stored deposit 2: %+v %+v", stored, rescanned)
	})

	// Two transfers of one transaction, mined again in another block,
	// where two /webhook/payments deposits of it, credited and
	// compensated, hold claims: the first new one a pass stores watches
	// them again (locks them, in id order; another session holds the
	// second). The rescan stores the second new one first, then wants the
	// holders. Events in id order alone do not help here.
	t.Run("claim holders", func(t *testing.T) {
		f, _ := setup(t)
		ctx := context.Background()
		for _, h := range []struct{ id, index string }{{"held-a", "5"}, {"held-b", "6"}} {
			held := f.transferDeposit(h.id, 1, "USDC", "10", txA, h.index)
			item := postgres.LedgerItem{Event: held, Chain: &postgres.ChainEvidence{BlockNumber: 9, BlockHash: "0x" + strings.Repeat("a", 64),
				FirstLogIndex: 3, Watch: true, Transfers: []string{h.index}}}
			results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{item}, postgres.LedgerOptions{})
			require.NoError(t, err)
			require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
			r, err := f.db.ReverseDeposit(ctx, h.id, "gone", "")
			require.NoError(t, err)
			require.Equal(t, postgres.Compensating, r)
		}
		testenv.SettleOutbox(t, f.db)

		first, second := tokenDeposit(txA, 12), tokenDeposit(txA, 13)
		var rescanned []postgres.StoredDeposit
		stored, cursorErr, rescanErr := race(t, f, "held-b", []postgres.NewEvent{first, second},
			rescan(f, []postgres.NewEvent{second}, &rescanned))
		require.NoError(t, cursorErr, "cursor pass")
		require.NoError(t, rescanErr, "rescan pass")
		once(t, f, first, second)
		var watched int
		for _, s := range append(append([]postgres.StoredDeposit{}, stored...), rescanned...) {
			if s.Returned == postgres.WatchedAgain {
				watched++
			}
		}
		require.Equal(t, 1, watched, "the holders are watched again by one event: %+v %+v", stored, rescanned)
		for _, id := range []string{"held-a", "held-b"} {
			var state string
			require.NoError(t, f.sql.QueryRow(ctx, `SELECT chain_state FROM payment_events WHERE event_id = $1`, id).Scan(&state))
			require.Equal(t, "watching", state, id)
		}
	})

	// A webhook batch (insert_events, rows in id order) holding the
	// same transfers as the pass found them in the other order.
	t.Run("webhook batch", func(t *testing.T) {
		f, stop := setup(t)
		first, second := scannedDeposit(1), scannedDeposit(2)
		var inserted []bool
		stored, cursorErr, batchErr := race(t, f, stop.Event.ID, []postgres.NewEvent{second, stop, first}, func() error {
			a, b := first, second
			a.Source, b.Source = postgres.SourcePayments, postgres.SourcePayments
			var err error
			inserted, _, err = f.db.InsertEventsTogether(context.Background(), []postgres.NewEvent{a, b}, 0)
			return err
		})
		require.NoError(t, cursorErr, "cursor pass")
		require.NoError(t, batchErr, "webhook batch")
		once(t, f, first, second)
		require.True(t, stored[2].Inserted != inserted[0], "one stored deposit 1: %+v %v", stored, inserted)
		require.True(t, stored[0].Inserted != inserted[1], "one stored deposit 2: %+v %v", stored, inserted)
	})
}
