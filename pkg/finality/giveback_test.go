package finality_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// alerts records the keys of the alerts raised.
type alerts struct {
	mu   sync.Mutex
	keys []string
}

func (a *alerts) Raise(key string, _ alert.Severity, _ string, _ map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, key)
}

func (a *alerts) raised() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...)
}

func (f *watchFixture) balance() decimal.Decimal {
	f.t.Helper()
	var text string
	require.NoError(f.t, f.conn.QueryRow(context.Background(), `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'ETH'), '0')`).Scan(&text))
	return decimal.RequireFromString(text)
}

func (f *watchFixture) exists(id string) bool {
	f.t.Helper()
	_, err := f.db.Event(context.Background(), id)
	if err == nil {
		return true
	}
	require.ErrorIs(f.t, err, payment.ErrNotFound)
	return false
}

// TestCompensatedDepositIsGivenBackWhenFinalAgain: a credited deposit
// reorged away is compensated; when the scanner finds its transaction on
// the chain again, it is watched again and given back once its block is
// finalized, never before, and only once. Leaving the chain again while
// watched again takes nothing more: it was compensated already.
func TestCompensatedDepositIsGivenBackWhenFinalAgain(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	raised := &alerts{}
	f.gate = finality.New(finality.Options{
		Store: f.db, Chain: f.chain, Assets: mustAssets(t, f.db), Policy: chain.FinalizedPolicy(),
		ReorgRecheckDelay: time.Hour, Alerts: raised, Log: zerolog.Nop(),
	})
	ctx := context.Background()
	tx := fmt.Sprintf("0x%064x", 0x9b)
	f.credit("back", tx)
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))
	gone := chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "no receipt; block 7 now has another hash"}
	f.chain.set(tx, gone, nil)
	f.watch()
	require.Equal(t, 1, f.compensations("back"))
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(f.balance()))

	// The scanner finds the transaction mined again: watched again, with
	// the evidence it had; nothing is credited yet.
	e, err := f.db.Event(ctx, "back")
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, "ETH_MAINNET", 0))
	claim, ok, err := f.db.ClaimScanCursor(ctx, "ETH_MAINNET", "scanner-1", time.Minute, 10, 100)
	require.NoError(t, err)
	require.True(t, ok)
	stored, err := f.db.CompleteScanPass(ctx, "ETH_MAINNET", "scanner-1", claim, []postgres.NewEvent{{Event: payment.Event{
		ID: e.ID, Type: e.Type, UserID: e.UserID, Asset: e.Asset, Amount: e.Amount, TxHash: e.TxHash, TraceID: e.TraceID,
	}, Source: postgres.SourcePayments}})
	require.NoError(t, err)
	require.Len(t, stored, 1)
	require.NoError(t, stored[0].Err)
	require.Equal(t, postgres.WatchedAgain, stored[0].Returned)
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 7, BlockHash: blockHash(7)}, f.row("back"))

	// Mined in block 9, not final: still nothing.
	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 9, BlockHash: blockHash(9)}, nil)
	f.watch()
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 9, BlockHash: blockHash(9)}, f.row("back"))
	require.False(t, f.exists(payment.ReturnEventID(1, "back")))

	// Gone again before final: back to compensated, and no second
	// compensation (the first still stands).
	f.chain.set(tx, chain.Canonicity{State: chain.Gone, BlockNumber: 9, BlockHash: blockHash(9), Reason: "block 9 replaced"}, nil)
	f.watch()
	require.Equal(t, "reorged", f.row("back").ChainState)
	require.False(t, f.exists(payment.CycleCompensationEventID(2, "back")))
	require.False(t, f.exists(payment.ReturnEventID(1, "back")))

	// Reported again, and this time final: given back, once.
	r, err := f.db.ReturnDeposit(ctx, "back", payment.Transfer{}, true, "reported again")
	require.NoError(t, err)
	require.Equal(t, postgres.WatchedAgain, r)
	f.chain.set(tx, chain.Canonicity{State: chain.Final, BlockNumber: 9, BlockHash: blockHash(9)}, nil)
	f.watch()
	require.Equal(t, "final", f.row("back").ChainState)
	require.True(t, f.exists(payment.ReturnEventID(1, "back")))
	require.Equal(t, []string{"deposit_reorged:back", "deposit_reorged:back", "deposit_given_back:back"}, raised.raised())
	f.chain.takeAsked()
	f.watch()
	require.Empty(t, f.chain.takeAsked(), "a deposit given back at finality is no longer watched")
	r, err = f.db.ReturnDeposit(ctx, "back", payment.Transfer{}, true, "reported once more")
	require.NoError(t, err)
	require.Equal(t, postgres.NotCompensated, r, "given back once")
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))

	var rows int
	var sum string
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*), SUM(amount)::text FROM balance_events WHERE user_id = 1`).Scan(&rows, &sum))
	require.Equal(t, 3, rows, "credit, compensation, give-back")
	require.True(t, decimal.NewFromInt(1).Equal(decimal.RequireFromString(sum)))
	testenv.RequireInvariants(t, f.db)
}

// TestGivenBackWhenMovedToAFinalBlock: the watcher's other road to
// finality, a transaction found final in another block, gives a
// compensated deposit back too; a deposit never compensated that moves
// to a final block gets nothing more.
func TestGivenBackWhenMovedToAFinalBlock(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	ctx := context.Background()
	tx, plain := fmt.Sprintf("0x%064x", 0x9c), fmt.Sprintf("0x%064x", 0x9d)
	f.credit("moved-back", tx)
	f.chain.set(tx, chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "replaced"}, nil)
	f.watch()
	testenv.SettleOutbox(t, f.db) // the compensation applied: a give-back credit reverses it
	r, err := f.db.ReturnDeposit(ctx, "moved-back", payment.Transfer{}, true, "reported again")
	require.NoError(t, err)
	require.Equal(t, postgres.WatchedAgain, r)
	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 8, BlockHash: blockHash(8), Final: true}, nil)
	f.watch()
	require.Equal(t, "final", f.row("moved-back").ChainState)
	require.True(t, f.exists(payment.ReturnEventID(1, "moved-back")))
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))

	f.credit("plain", plain)
	f.chain.set(plain, chain.Canonicity{State: chain.Moved, BlockNumber: 8, BlockHash: blockHash(8), Final: true}, nil)
	f.watch()
	require.Equal(t, "final", f.row("plain").ChainState)
	require.False(t, f.exists(payment.ReturnEventID(1, "plain")))
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.NewFromInt(2).Equal(f.balance()))
	testenv.RequireInvariants(t, f.db)
}

func mustAssets(t *testing.T, db *postgres.DB) *payment.Registry {
	t.Helper()
	assets, err := db.Assets(context.Background())
	require.NoError(t, err)
	return assets
}

// TestScannerGivesBackADepositNamedByPayments: a deposit /webhook/payments
// named (its own id) is credited, claims its transfer, and is compensated
// when the transaction leaves the chain. The scanner then finds the
// transfer mined again under the transfer's own id: that event ends
// duplicate_transfer, and the deposit holding the claim is watched again
// and given back once final.
func TestScannerGivesBackADepositNamedByPayments(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	ctx := context.Background()
	tx := fmt.Sprintf("0x%064x", 0x9e)
	f.credit("pay-1", tx)
	f.chain.set(tx, chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "replaced"}, nil)
	f.watch()
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(f.balance()))

	scanned := payment.Transfer{Network: "ETH_MAINNET", TxHash: tx, Index: payment.TransferNative}
	require.NoError(t, f.db.InitScanCursor(ctx, "ETH_MAINNET", 0))
	claim, ok, err := f.db.ClaimScanCursor(ctx, "ETH_MAINNET", "scanner-1", time.Minute, 10, 100)
	require.NoError(t, err)
	require.True(t, ok)
	stored, err := f.db.CompleteScanPass(ctx, "ETH_MAINNET", "scanner-1", claim, []postgres.NewEvent{{Event: payment.Event{
		ID: scanned.EventID(), Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
		TxHash: tx, TransferIndex: payment.TransferNative, Network: "ETH_MAINNET", TraceID: "scan",
	}, Source: postgres.Source("scanner")}})
	require.NoError(t, err)
	require.Len(t, stored, 1)
	require.True(t, stored[0].Inserted)
	require.Equal(t, postgres.WatchedAgain, stored[0].Returned)
	require.Equal(t, "watching", f.row("pay-1").ChainState)

	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 9, BlockHash: blockHash(9), Final: true}, nil)
	f.watch()
	require.True(t, f.exists(payment.ReturnEventID(1, "pay-1")))
	testenv.SettleOutbox(t, f.db)
	e, err := f.db.Event(ctx, scanned.EventID())
	require.NoError(t, err)
	require.Equal(t, string(payment.OutcomeDuplicateTransfer), e.Outcome, "the transfer stays claimed by the deposit that named it")
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()))
	testenv.RequireInvariants(t, f.db)
}

// TestNothingGivenBackForACompensationNeverApplied: the watcher's road
// for a deposit held for a withdrawal when its transaction left the
// chain: its compensation is dead-lettered (the available balance is 0),
// so when the transfer is final again nothing is given back: the
// compensation is cancelled and its dead letter discarded. One credit, one
// transfer on the chain.
func TestNothingGivenBackForACompensationNeverApplied(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	ctx := context.Background()
	tx := fmt.Sprintf("0x%064x", 0x9e)
	f.credit("held", tx)
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "hold", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH",
		Amount: decimal.NewFromInt(1), Network: "ETH_MAINNET", ToAddress: "0x00000000000000000000000000000000000000aa", TraceID: "trace-hold"},
		Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	testenv.SettleOutbox(t, f.db)
	f.chain.set(tx, chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "replaced"}, nil)
	f.watch()
	testenv.SettleOutbox(t, f.db)
	comp, err := f.db.Event(ctx, payment.CompensationEventID("held"))
	require.NoError(t, err)
	require.Equal(t, string(payment.OutcomeDeadLettered), comp.Outcome)

	r, err := f.db.ReturnDeposit(ctx, "held", payment.Transfer{}, true, "reported again")
	require.NoError(t, err)
	require.Equal(t, postgres.WatchedAgain, r)
	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 8, BlockHash: blockHash(8), Final: true}, nil)
	f.watch()
	require.Equal(t, "final", f.row("held").ChainState)
	testenv.SettleOutbox(t, f.db)
	require.False(t, f.exists(payment.ReturnEventID(1, "held")), "no give-back credit")
	require.True(t, decimal.NewFromInt(1).Equal(f.balance()), "balance %s", f.balance())
	comp, err = f.db.Event(ctx, payment.CompensationEventID("held"))
	require.NoError(t, err)
	require.Equal(t, string(payment.OutcomeReorged), comp.Outcome, "cancelled")
	open, err := f.db.DeadLetters(ctx, "open", 0, 10)
	require.NoError(t, err)
	require.Empty(t, open)
	testenv.RequireInvariants(t, f.db)
}
