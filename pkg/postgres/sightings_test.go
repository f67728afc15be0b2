package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestSightingsKeptAndDeleted: a sighting's block must be a block hash;
// a removal sticks, whatever is reported of the block after it; sightings
// older than the retention go with the transfer reports, newer ones stay,
// and a transfer with a block reported removed keeps them all.
func TestSightingsKeptAndDeleted(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })

	reorged := payment.Transfer{Network: "ETH_MAINNET", TxHash: fmt.Sprintf("0x%064x", 1), Index: "3"}
	plain := payment.Transfer{Network: "ETH_MAINNET", TxHash: fmt.Sprintf("0x%064x", 2), Index: "0"}
	sight := func(tr payment.Transfer, block string, removed bool) error {
		_, err := db.SightTransfer(ctx, postgres.Sighting{Transfer: tr, BlockHash: block, Removed: removed, Reporter: "alchemy", Reason: "test"})
		return err
	}
	require.Error(t, sight(reorged, "0xABC", false), "not a block hash")
	old, kept := fmt.Sprintf("0x%064x", 0xb1), fmt.Sprintf("0x%064x", 0xb2)
	require.NoError(t, sight(reorged, old, true))
	require.NoError(t, sight(reorged, old, false))
	require.NoError(t, sight(reorged, kept, false))
	s, err := db.EventSightings(ctx, reorged.EventID())
	require.NoError(t, err)
	require.Len(t, s, 2)
	require.Equal(t, old, s[0].BlockHash)
	require.True(t, s[0].Removed, "a removal sticks")
	require.NotNil(t, s[0].RemovedAt)
	require.False(t, s[1].Removed)
	require.NoError(t, sight(plain, old, false))
	require.NoError(t, sight(plain, kept, false))

	_, err = conn.Exec(ctx, `UPDATE transfer_sightings SET first_at = now() - interval '10 days' WHERE block_hash = $1`, old)
	require.NoError(t, err)
	tables, err := db.Cleanup(ctx, 7*24*time.Hour, postgres.CleanupOptions{Batch: 1})
	require.NoError(t, err)
	require.Equal(t, postgres.CleanupSightings, tables[2].Table)
	require.EqualValues(t, 1, tables[2].Deleted, "the plain transfer's old sighting")
	s, err = db.EventSightings(ctx, plain.EventID())
	require.NoError(t, err)
	require.Len(t, s, 1)
	require.Equal(t, kept, s[0].BlockHash)
	s, err = db.EventSightings(ctx, reorged.EventID())
	require.NoError(t, err)
	require.Len(t, s, 2, "a transfer with a removed block keeps its sightings")
}

// TestRemovedSightingOutlivesRetention: on a network without an RPC, a
// deposit compensated because its block was reported removed stays so
// when a stale add of that block arrives after the retention's cleanup
// (the cleanup deleted the removal, and the stale add gave it back).
func TestRemovedSightingOutlivesRetention(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)

	tr := payment.Transfer{Network: "BASE_MAINNET", TxHash: fmt.Sprintf("0x%064x", 7), Index: "3"}
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: tr.EventID(), Type: payment.Deposit, UserID: 1, Asset: "USDC",
		Amount: decimal.RequireFromString("10"), TxHash: tr.TxHash, Network: tr.Network}, Source: postgres.SourceAlchemy})
	require.NoError(t, err)
	testenv.SettleOutbox(t, db)
	balance := func() string {
		var b string
		require.NoError(t, conn.QueryRow(ctx, `SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'USDC'`).Scan(&b))
		return decimal.RequireFromString(b).String()
	}
	require.Equal(t, "10", balance())

	block := fmt.Sprintf("0x%064x", 0xa)
	sight := func(removed bool) postgres.Sighted {
		s, err := db.SightTransfer(ctx, postgres.Sighting{Transfer: tr, BlockHash: block, Removed: removed, Reporter: "alchemy", Reason: "test"})
		require.NoError(t, err)
		return s
	}
	sight(false)
	require.Equal(t, postgres.Compensating, sight(true).Reversal)
	testenv.SettleOutbox(t, db)
	require.Equal(t, "0", balance(), "compensated")

	_, err = conn.Exec(ctx, `UPDATE transfer_sightings SET first_at = now() - interval '15 days'`)
	require.NoError(t, err)
	_, err = db.Cleanup(ctx, postgres.CleanupRetentionDefault, postgres.CleanupOptions{})
	require.NoError(t, err)
	s := sight(false)
	require.False(t, s.OnChain, "block removed")
	testenv.SettleOutbox(t, db)
	require.Equal(t, "0", balance(), "a stale add of a removed block credits nothing")
}

// TestFrozenReportLetsGoOfTheDeposit: an api replica cut off while it
// records a provider's report (a lost node, a paused VM: its socket
// neither answers nor resets) must not keep the deposit's row locked
// until the kernel gives its socket up, hours later: the ledger could not
// credit it, and past RETRY_CONTENTION_WINDOW the deposit would go to the
// DLQ. Here replica A's report waits for the deposit's row held
// elsewhere, A is frozen there, and the row is let go, so A's
// transaction sits open holding it; a worker must still credit it.
func TestFrozenReportLetsGoOfTheDeposit(t *testing.T) {
	defer postgres.SetTxIdleMax(time.Second)()
	ctx := context.Background()
	f := newFixture(t)
	f.user(1, nil)
	tr := payment.Transfer{Network: "ETH_MAINNET", TxHash: fmt.Sprintf("0x%064x", 0xf1), Index: "0"}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: tr.EventID(), Type: payment.Deposit, UserID: 1,
		Asset: "ETH", Amount: decimal.RequireFromString("2"), TxHash: tr.TxHash, TransferIndex: tr.Index, Network: tr.Network, TraceID: "t-frozen"},
		Source: postgres.SourceScanner, ToAddress: "0x" + fmt.Sprintf("%040x", 0x44)})
	require.NoError(t, err)
	require.True(t, inserted)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	deposit := claimed[0].Event

	hold, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, deposit.ID)
	require.NoError(t, err)

	freezer, doneA := f.frozenMidTransaction(t, hold, func(replicaA *postgres.DB) error {
		_, err := replicaA.SightTransfer(ctx, postgres.Sighting{Transfer: tr, BlockHash: fmt.Sprintf("0x%064x", 0xb1),
			Reporter: "alchemy", Reason: "test"})
		return err
	})
	f.requireAppliedWithin(t, deposit, "the deposit")
	requireEndedWhileFrozen(t, freezer, doneA)
	require.True(t, f.balance(1, "ETH").Equal(dec("2")), "credited once: %s", f.balance(1, "ETH"))
	f.requireJournalInvariant()
}
