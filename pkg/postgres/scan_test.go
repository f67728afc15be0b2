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

// TestScanCursorLease: one owner at a time holds a network's range; the
// loser's completion stores nothing and moves nothing; a pass's events
// commit with the cursor.
func TestScanCursorLease(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	require.NoError(t, db.InitScanCursor(ctx, network, 100))
	require.NoError(t, db.InitScanCursor(ctx, network, 5), "a second first run keeps the first cursor")

	_, ok, err := db.ClaimScanCursor(ctx, network, "a", time.Minute, 10, 99)
	require.NoError(t, err)
	require.False(t, ok, "the cursor is past the head")
	claim, ok, err := db.ClaimScanCursor(ctx, network, "a", time.Minute, 10, 150)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, postgres.ScanClaim{From: 100, To: 109}, claim)
	_, ok, err = db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 150)
	require.NoError(t, err)
	require.False(t, ok, "a live lease keeps b out")

	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	ev := postgres.NewEvent{Event: payment.Event{ID: "chain:ETH_MAINNET:0x" + strings.Repeat("ab", 32) + ":native", Type: payment.Deposit,
		UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1.5"), TxHash: "0x" + strings.Repeat("ab", 32), TransferIndex: payment.TransferNative},
		Source: postgres.SourceScanner, ToAddress: "0x" + strings.Repeat("11", 20)}
	_, err = db.CompleteScanPass(ctx, network, "b", claim, []postgres.NewEvent{ev})
	require.ErrorIs(t, err, postgres.ErrLeaseLost)
	_, err = db.Event(ctx, ev.Event.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "the loser stored nothing")

	stored, err := db.CompleteScanPass(ctx, network, "a", claim, []postgres.NewEvent{ev})
	require.NoError(t, err)
	require.Equal(t, []postgres.StoredDeposit{{Inserted: true}}, stored)
	next, _, found, err := db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.True(t, found)
	require.EqualValues(t, 110, next)
	_, err = db.CompleteScanPass(ctx, network, "a", claim, nil)
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "a range completes once")

	// The same transfer again (a rescan, a webhook): a duplicate.
	claim, ok, err = db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 150)
	require.NoError(t, err)
	require.True(t, ok)
	stored, err = db.CompleteScanPass(ctx, network, "b", claim, []postgres.NewEvent{ev})
	require.NoError(t, err)
	require.Equal(t, []postgres.StoredDeposit{{}}, stored)

	// An expired lease is taken over.
	_, ok, err = db.ClaimScanCursor(ctx, network, "a", time.Millisecond, 10, 150)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(5 * time.Millisecond)
	_, ok, err = db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 150)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestBackfillEnd: a backfill ends at the last block the cursor's passes
// may have scanned without the address, the claimed range included.
func TestBackfillEnd(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	for _, a := range []string{"0x" + strings.Repeat("11", 20), "0x" + strings.Repeat("22", 20)} {
		_, err = db.AddDepositAddress(ctx, network, a, 1)
		require.NoError(t, err)
	}
	require.NoError(t, db.AddBackfill(ctx, "bf-1", network, "0x"+strings.Repeat("11", 20), 40))
	require.NoError(t, db.AddBackfill(ctx, "bf-2", network, "0x"+strings.Repeat("22", 20), 200))
	require.NoError(t, db.ResolveBackfills(ctx, []string{network}))
	job, err := db.Rescan(ctx, "bf-1")
	require.NoError(t, err)
	require.Nil(t, job.ToBlock, "no cursor yet: the end waits")
	_, ok, err := db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a backfill without an end is not claimed")

	require.NoError(t, db.InitScanCursor(ctx, network, 100))
	_, ok, err = db.ClaimScanCursor(ctx, network, "a", time.Minute, 10, 150)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, db.ResolveBackfills(ctx, []string{network}))
	job, err = db.Rescan(ctx, "bf-1")
	require.NoError(t, err)
	require.NotNil(t, job.ToBlock)
	require.EqualValues(t, 109, *job.ToBlock, "through the range a pass holds")
	require.Equal(t, "running", job.Status)
	job, err = db.Rescan(ctx, "bf-2")
	require.NoError(t, err)
	require.Equal(t, "done", job.Status, "from block 200 on the cursor sees the address")

	claim, ok, err := db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, postgres.RescanClaim{ID: "bf-1", Network: network, Address: "0x" + strings.Repeat("11", 20), Next: 40, To: 109}, claim)
	_, err = db.CompleteRescanPass(ctx, "bf-1", "b", 40, 89, "", 128, nil)
	require.ErrorIs(t, err, postgres.ErrLeaseLost)
	_, err = db.CompleteRescanPass(ctx, "bf-1", "a", 40, 89, "", 128, []postgres.NewEvent{scannedDeposit(1), scannedDeposit(2)})
	require.NoError(t, err)
	claim, ok, err = db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 90, claim.Next)
	_, err = db.CompleteRescanPass(ctx, "bf-1", "a", 90, 109, "", 128, nil)
	require.NoError(t, err)
	job, err = db.Rescan(ctx, "bf-1")
	require.NoError(t, err)
	require.Equal(t, "done", job.Status)
	require.Equal(t, 2, job.Found)
	require.EqualValues(t, 110, job.NextBlock)
}

// TestScanPassReopensReorged: a scanned transfer already stored with the
// same content is a duplicate; if that deposit ended failed/reorged,
// not_found or reverted, the scan shows it final and successful on the
// chain now (a transaction dropped and mined again past FINALITY_TIMEOUT)
// and it is reopened, in the pass's transaction. A mismatch stays (the
// chain's own content supersedes it instead). A reopen that cannot finish fails
// the pass whole: nothing stored, the cursor where it was.
func TestScanPassReopensReorged(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	const network = "ETH_MAINNET"
	_, err := f.db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, 100))
	scanned := func(n int) postgres.NewEvent {
		hash := fmt.Sprintf("0x%064x", 0xe00+n)
		return postgres.NewEvent{Event: payment.Event{ID: "chain:ETH_MAINNET:" + hash + ":native", Type: payment.Deposit,
			UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("2"), TxHash: hash, TransferIndex: payment.TransferNative, Network: network},
			Source: postgres.SourceScanner, ToAddress: "0x" + strings.Repeat("22", 20)}
	}
	pass := func(owner string, events ...postgres.NewEvent) ([]postgres.StoredDeposit, error) {
		t.Helper()
		claim, ok, err := f.db.ClaimScanCursor(ctx, network, owner, time.Minute, 10, 1000)
		require.NoError(t, err)
		require.True(t, ok)
		stored, err := f.db.CompleteScanPass(ctx, network, owner, claim, events)
		if err != nil {
			require.NoError(t, f.db.ReleaseScanCursor(ctx, network, owner))
		}
		return stored, err
	}
	status := func(id string) (string, string, int) {
		t.Helper()
		var s, outcome string
		var generation int
		require.NoError(t, f.sql.QueryRow(ctx, `SELECT status, COALESCE(outcome, ''), generation FROM payment_events WHERE event_id = $1`, id).
			Scan(&s, &outcome, &generation))
		return s, outcome, generation
	}
	reorged, mismatch, locked, notFound, reverted := scanned(1), scanned(2), scanned(3), scanned(4), scanned(5)
	stored, err := pass("a", reorged, mismatch, locked, notFound, reverted)
	require.NoError(t, err)
	require.Equal(t, []postgres.StoredDeposit{{Inserted: true}, {Inserted: true}, {Inserted: true}, {Inserted: true}, {Inserted: true}}, stored)
	for id, outcome := range map[string]string{reorged.Event.ID: "reorged", mismatch.Event.ID: "mismatch", locked.Event.ID: "reorged",
		notFound.Event.ID: "not_found", reverted.Event.ID: "reverted"} {
		_, err = f.sql.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = $2, chain_state = CASE $2 WHEN 'reorged' THEN 'reorged' END
			WHERE event_id = $1`, id, outcome)
		require.NoError(t, err)
	}
	_, _, before := status(reorged.Event.ID)

	stored, err = pass("a", reorged, mismatch, notFound, reverted)
	require.NoError(t, err)
	require.Equal(t, []postgres.StoredDeposit{{Reopened: true}, {}, {Reopened: true}, {Reopened: true}}, stored)
	for _, e := range []postgres.NewEvent{notFound, reverted} {
		s, outcome, _ := status(e.Event.ID)
		require.Equal(t, "pending/", s+"/"+outcome, e.Event.ID)
	}
	s, outcome, generation := status(reorged.Event.ID)
	require.Equal(t, "pending", s)
	require.Empty(t, outcome)
	require.Equal(t, before+1, generation)
	s, outcome, _ = status(mismatch.Event.ID)
	require.Equal(t, "failed/mismatch", s+"/"+outcome, "a mismatch is not reopened by its own content seen again")
	stored, err = pass("a", reorged)
	require.NoError(t, err)
	require.Equal(t, []postgres.StoredDeposit{{}}, stored, "reopened once")

	// Another session holds the deposit's row: the reopen waits, the
	// pass runs out of time and stores nothing.
	next, _, _, err := f.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	hold, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, locked.Event.ID)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	claim, ok, err := f.db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 1000)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = f.db.CompleteScanPass(short, network, "b", claim, []postgres.NewEvent{scanned(6), locked})
	require.Error(t, err)
	require.NoError(t, hold.Rollback(ctx))
	_, err = f.db.Event(ctx, scanned(6).Event.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "the failed pass stored nothing")
	again, _, _, err := f.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.Equal(t, next, again, "the cursor did not move")
	s, outcome, _ = status(locked.Event.ID)
	require.Equal(t, "failed/reorged", s+"/"+outcome)
}

// TestRescanClaimTurnsAndWaits: a job whose next block is above the
// finality head is not claimed and is marked waiting, so it holds no
// other back; the claimable jobs take turns by their last pass; an
// operator's cancel ends a running job, and a pass under way then stores
// nothing.
func TestRescanClaimTurnsAndWaits(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	_, err := db.CreateRescan(ctx, "r-future", network, 5000, 5100, "op")
	require.NoError(t, err)
	_, err = db.CreateRescan(ctx, "r-long", network, 10, 40, "op")
	require.NoError(t, err)
	_, err = db.CreateRescan(ctx, "r-short", network, 50, 50, "op")
	require.NoError(t, err)
	_, err = db.CreateRescan(ctx, "r-other", "BASE_MAINNET", 1, 1, "op")
	require.NoError(t, err)

	networks, err := db.RescanNetworks(ctx, []string{network, "BASE_MAINNET", "OP_MAINNET"})
	require.NoError(t, err)
	require.Equal(t, []string{"BASE_MAINNET", network}, networks)
	waiting, err := db.MarkRescansWaiting(ctx, network, 100)
	require.NoError(t, err)
	require.Equal(t, 1, waiting)
	job, err := db.Rescan(ctx, "r-future")
	require.NoError(t, err)
	require.NotNil(t, job.WaitingHead)
	require.EqualValues(t, 100, *job.WaitingHead)
	job, err = db.Rescan(ctx, "r-long")
	require.NoError(t, err)
	require.Nil(t, job.WaitingHead)

	claim, ok, err := db.ClaimRescan(ctx, network, 100, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r-long", claim.ID, "the oldest job the head allows")
	_, err = db.CompleteRescanPass(ctx, "r-long", "a", 10, 19, "", 128, nil)
	require.NoError(t, err)
	claim, ok, err = db.ClaimRescan(ctx, network, 100, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r-short", claim.ID, "after a pass of the long job, the next one's turn")
	_, err = db.CompleteRescanPass(ctx, "r-short", "a", 50, 50, "", 128, nil)
	require.NoError(t, err)
	claim, ok, err = db.ClaimRescan(ctx, network, 100, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r-long", claim.ID)
	_, ok, err = db.ClaimRescan(ctx, network, 100, "b", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "leased, and the rest waits above the head")

	require.NoError(t, db.CancelRescan(ctx, "r-long", "op", "typo"))
	_, err = db.CompleteRescanPass(ctx, "r-long", "a", 20, 29, "", 128, nil)
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "the pass under way stores nothing")
	job, err = db.Rescan(ctx, "r-long")
	require.NoError(t, err)
	require.Equal(t, "failed", job.Status)
	require.Equal(t, "cancelled by op: typo", job.Error)
	require.EqualValues(t, 20, job.NextBlock)
	require.ErrorIs(t, db.CancelRescan(ctx, "r-long", "op", "again"), postgres.ErrRescanEnded, "failed already")
	require.ErrorIs(t, db.CancelRescan(ctx, "r-short", "op", "done already"), postgres.ErrRescanEnded)
	require.ErrorIs(t, db.CancelRescan(ctx, "r-none", "op", "typo"), payment.ErrNotFound)

	// A pending backfill can be cancelled too (its end is no longer pending).
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.AddDepositAddress(ctx, network, "0x"+strings.Repeat("33", 20), 1)
	require.NoError(t, err)
	require.NoError(t, db.AddBackfill(ctx, "bf-c", network, "0x"+strings.Repeat("33", 20), 7))
	require.NoError(t, db.CancelRescan(ctx, "bf-c", "op", "wrong block"))

	waiting, err = db.MarkRescansWaiting(ctx, network, 6000)
	require.NoError(t, err)
	require.Zero(t, waiting)
	job, err = db.Rescan(ctx, "r-future")
	require.NoError(t, err)
	require.Nil(t, job.WaitingHead, "the head reached it")
}

// TestFailedRescanPassGoesToTheBack: a job whose pass failed and was
// released waits for the other jobs of its network to take their turn
// (it was claimed first again on every pass, and a job failing for
// reasons of its own held the others back).
func TestFailedRescanPassGoesToTheBack(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	for _, id := range []string{"r-failing", "r-next"} {
		_, err := db.CreateRescan(ctx, id, network, 10, 20, "op")
		require.NoError(t, err)
	}
	claim, ok, err := db.ClaimRescan(ctx, network, 100, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r-failing", claim.ID)
	require.NoError(t, db.ReleaseRescan(ctx, "r-failing", "a"))
	claim, ok, err = db.ClaimRescan(ctx, network, 100, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "r-next", claim.ID, "the other job's turn")
}

// TestRescanKeepsItsLastHash: a rescan pass records the hash of the last
// block it read, and the job's next claim hands it over; a restart sends
// the job back (SCAN_REORG_RESCAN blocks, never before its start, or to
// its start when that is off), forgets the hash and gives the lease
// back, and only the pass holding the lease at that block can do it.
func TestRescanKeepsItsLastHash(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	hash := "0x" + strings.Repeat("ab", 32)
	_, err := db.CreateRescan(ctx, "r-hash", network, 10, 99, "op")
	require.NoError(t, err)
	claim, ok, err := db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, claim.LastHash, "a new job knows no hash")
	_, err = db.CompleteRescanPass(ctx, "r-hash", "a", 10, 29, hash, 128, nil)
	require.NoError(t, err)
	claim, ok, err = db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, postgres.RescanClaim{ID: "r-hash", Network: network, Next: 30, To: 99, LastHash: hash}, claim)

	_, err = db.RestartRescan(ctx, "r-hash", "b", 30, 5, "test")
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "not the lease's owner")
	_, err = db.RestartRescan(ctx, "r-hash", "a", 31, 5, "test")
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "not the pass's block")
	next, err := db.RestartRescan(ctx, "r-hash", "a", 30, 5, "test")
	require.NoError(t, err)
	require.EqualValues(t, 25, next)
	job, err := db.Rescan(ctx, "r-hash")
	require.NoError(t, err)
	require.Equal(t, "running", job.Status)
	require.EqualValues(t, 25, job.NextBlock)

	claim, ok, err = db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok, "the lease was given back")
	require.Empty(t, claim.LastHash, "the hash is forgotten")
	next, err = db.RestartRescan(ctx, "r-hash", "a", 25, 128, "test")
	require.NoError(t, err)
	require.EqualValues(t, 10, next, "never before the job's start")
	_, ok, err = db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = db.CompleteRescanPass(ctx, "r-hash", "a", 10, 49, hash, 128, nil)
	require.NoError(t, err)
	_, ok, err = db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	next, err = db.RestartRescan(ctx, "r-hash", "a", 50, -1, "test")
	require.NoError(t, err)
	require.EqualValues(t, 10, next, "SCAN_REORG_RESCAN off: the whole range")
}

// scannedDeposit is a scanned ETH deposit of user 1 on ETH_MAINNET, its
// transaction numbered n.
func scannedDeposit(n int) postgres.NewEvent {
	hash := fmt.Sprintf("0x%064x", 0xf00+n)
	return postgres.NewEvent{Event: payment.Event{ID: "chain:ETH_MAINNET:" + hash + ":native", Type: payment.Deposit,
		UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"), TxHash: hash, TransferIndex: payment.TransferNative, Network: "ETH_MAINNET"},
		Source: postgres.SourceScanner, ToAddress: "0x" + strings.Repeat("33", 20)}
}

// TestRescanRestartCountsOnce: a restart is recorded on the job (how
// often, when, why and from which block it reads again), and the blocks
// it reads again add to found only the transfers the job had not found:
// one found before and again counts once, one the fork mined there
// counts. A pass that lost its lease counts nothing, and the ids go when
// the job ends (done, failed or cancelled).
func TestRescanRestartCountsOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	db, conn := f.db, f.sql
	const network = "ETH_MAINNET"
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	ids := func(job string) int {
		t.Helper()
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM rescan_found WHERE job_id = $1`, job).Scan(&n))
		return n
	}
	claim := func() {
		t.Helper()
		_, ok, err := db.ClaimRescan(ctx, network, 1000, "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
	}
	hash := "0x" + strings.Repeat("ab", 32)
	_, err = db.CreateRescan(ctx, "r-count", network, 10, 99, "op")
	require.NoError(t, err)
	claim()
	_, err = db.CompleteRescanPass(ctx, "r-count", "a", 10, 29, hash, 128, []postgres.NewEvent{scannedDeposit(1), scannedDeposit(2)})
	require.NoError(t, err)
	job, err := db.Rescan(ctx, "r-count")
	require.NoError(t, err)
	require.Equal(t, 2, job.Found)
	require.Zero(t, job.Restarts)
	require.Nil(t, job.LastRestartAt)
	require.Empty(t, job.LastRestartReason)

	claim()
	next, err := db.RestartRescan(ctx, "r-count", "a", 30, 128, "the branch changed under the job")
	require.NoError(t, err)
	require.EqualValues(t, 10, next)
	job, err = db.Rescan(ctx, "r-count")
	require.NoError(t, err)
	require.Equal(t, 1, job.Restarts)
	require.NotNil(t, job.LastRestartAt)
	require.Equal(t, "the branch changed under the job; reading again from block 10", job.LastRestartReason)
	require.Equal(t, 2, job.Found, "a restart takes nothing off")

	// Read again: deposit 1 is there still, 2 is gone with the old branch,
	// 3 is the fork's.
	claim()
	_, err = db.CompleteRescanPass(ctx, "r-count", "b", 10, 29, hash, 128, []postgres.NewEvent{scannedDeposit(4)})
	require.ErrorIs(t, err, postgres.ErrLeaseLost)
	_, err = db.CompleteRescanPass(ctx, "r-count", "a", 10, 29, hash, 128, []postgres.NewEvent{scannedDeposit(1), scannedDeposit(3)})
	require.NoError(t, err)
	job, err = db.Rescan(ctx, "r-count")
	require.NoError(t, err)
	require.Equal(t, 3, job.Found, "each transfer once: deposit 1 read twice counts once")
	require.Equal(t, 3, ids("r-count"), "the lease lost pass recorded nothing")

	claim()
	next, err = db.RestartRescan(ctx, "r-count", "a", 30, -1, "again")
	require.NoError(t, err)
	require.EqualValues(t, 10, next)
	claim()
	_, err = db.CompleteRescanPass(ctx, "r-count", "a", 10, 99, hash, 128, []postgres.NewEvent{scannedDeposit(1), scannedDeposit(3), scannedDeposit(5)})
	require.NoError(t, err)
	job, err = db.Rescan(ctx, "r-count")
	require.NoError(t, err)
	require.Equal(t, "done", job.Status)
	require.Equal(t, 4, job.Found)
	require.Equal(t, 2, job.Restarts)
	require.Equal(t, "again; reading again from block 10", job.LastRestartReason)
	require.Zero(t, ids("r-count"), "a job done keeps no ids")

	// A job cancelled or failed keeps none either.
	for _, id := range []string{"r-cancel", "r-fail"} {
		_, err = db.CreateRescan(ctx, id, network, 10, 99, "op")
		require.NoError(t, err)
	}
	for _, id := range []string{"r-cancel", "r-fail"} { // in turn
		claim()
		_, err = db.CompleteRescanPass(ctx, id, "a", 10, 29, hash, 128, []postgres.NewEvent{scannedDeposit(1)})
		require.NoError(t, err)
		require.Equal(t, 1, ids(id))
	}
	require.NoError(t, db.CancelRescan(ctx, "r-cancel", "op", "typo"))
	require.Zero(t, ids("r-cancel"))
	require.Equal(t, 1, ids("r-fail"))
	claim()
	require.NoError(t, db.FailRescan(ctx, "r-fail", "a", "cannot read"))
	require.Zero(t, ids("r-fail"))
	job, err = db.Rescan(ctx, "r-fail")
	require.NoError(t, err)
	require.Equal(t, "failed", job.Status)
	require.Equal(t, 1, job.Found)
}

// foundAt is scannedDeposit(n) found in block.
func foundAt(n int, block uint64) postgres.NewEvent {
	e := scannedDeposit(n)
	e.Block = block
	return e
}

// TestRescanFoundPrunedAsJobAdvances: a running job keeps the ids of
// what it found only as far back as a restart reads again
// (SCAN_REORG_RESCAN blocks below its next block), and found still
// counts a transfer read again after a restart once. Under finalized
// (no hash: no restart) it keeps none past the pass; with
// SCAN_REORG_RESCAN off (a restart reads the whole range) it keeps all;
// an id an older binary recorded without its block stays until the job
// ends. The job kept every id until it ended, one row per transfer of a
// backfill of millions of blocks.
func TestRescanFoundPrunedAsJobAdvances(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	db, conn := f.db, f.sql
	const network = "ETH_MAINNET"
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	blocks := func(job string) []int64 {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT COALESCE(block_number, -1) FROM rescan_found WHERE job_id = $1 ORDER BY 1`, job)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return got
	}
	// A network each, so each claim takes its job.
	nets := map[string]string{"r-prune": network, "r-final": "ETH_FINAL", "r-whole": "ETH_WHOLE"}
	claim := func(want string) {
		t.Helper()
		c, ok, err := db.ClaimRescan(ctx, nets[want], 10_000, "a", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, c.ID)
	}
	found := func(job string) int {
		t.Helper()
		j, err := db.Rescan(ctx, job)
		require.NoError(t, err)
		return j.Found
	}
	hash := "0x" + strings.Repeat("ab", 32)
	const depth = 20

	_, err = db.CreateRescan(ctx, "r-prune", network, 10, 999, "op")
	require.NoError(t, err)
	claim("r-prune")
	_, err = db.CompleteRescanPass(ctx, "r-prune", "a", 10, 29, hash, depth, []postgres.NewEvent{foundAt(1, 12), foundAt(2, 25)})
	require.NoError(t, err)
	require.Equal(t, []int64{12, 25}, blocks("r-prune"), "a restart from block 30 reads from block 10")
	_, err = conn.Exec(ctx, `INSERT INTO rescan_found (job_id, event_id) VALUES ('r-prune', 'older-binary')`)
	require.NoError(t, err)
	claim("r-prune")
	_, err = db.CompleteRescanPass(ctx, "r-prune", "a", 30, 59, hash, depth, []postgres.NewEvent{foundAt(3, 39), foundAt(4, 40), foundAt(5, 55)})
	require.NoError(t, err)
	require.Equal(t, []int64{-1, 40, 55}, blocks("r-prune"), "a restart from block 60 reads from block 40: the ids below go")
	require.Equal(t, 5, found("r-prune"))

	// The restart reads blocks 40 to 59 again: what it finds there again
	// counts once, the fork's new one counts.
	claim("r-prune")
	next, err := db.RestartRescan(ctx, "r-prune", "a", 60, depth, "test")
	require.NoError(t, err)
	require.EqualValues(t, 40, next)
	claim("r-prune")
	_, err = db.CompleteRescanPass(ctx, "r-prune", "a", 40, 59, hash, depth, []postgres.NewEvent{foundAt(4, 40), foundAt(5, 55), foundAt(6, 58)})
	require.NoError(t, err)
	require.Equal(t, 6, found("r-prune"), "deposits 4 and 5 read again count once")
	require.Equal(t, []int64{-1, 40, 55, 58}, blocks("r-prune"))

	// Under finalized no pass links to another, so none restarts.
	_, err = db.CreateRescan(ctx, "r-final", nets["r-final"], 10, 999, "op")
	require.NoError(t, err)
	claim("r-final")
	_, err = db.CompleteRescanPass(ctx, "r-final", "a", 10, 29, "", depth, []postgres.NewEvent{foundAt(1, 12), foundAt(2, 29)})
	require.NoError(t, err)
	require.Empty(t, blocks("r-final"), "no id outlives its pass")
	require.Equal(t, 2, found("r-final"))

	// SCAN_REORG_RESCAN off: a restart reads from the job's start.
	_, err = db.CreateRescan(ctx, "r-whole", nets["r-whole"], 10, 99_999, "op")
	require.NoError(t, err)
	claim("r-whole")
	_, err = db.CompleteRescanPass(ctx, "r-whole", "a", 10, 4999, hash, -1, []postgres.NewEvent{foundAt(1, 12), foundAt(2, 4000)})
	require.NoError(t, err)
	require.Equal(t, []int64{12, 4000}, blocks("r-whole"), "every id stays")

	// The job's end forgets the rest, the older binary's too.
	claim("r-prune")
	_, err = db.CompleteRescanPass(ctx, "r-prune", "a", 60, 999, hash, depth, []postgres.NewEvent{foundAt(7, 990)})
	require.NoError(t, err)
	require.Empty(t, blocks("r-prune"))
	require.Equal(t, 7, found("r-prune"))
}

// TestFrozenScannerLetsGoOfTheCursor: a scheduler cut off mid-pass (a
// lost node, a paused VM: its socket neither answers nor resets) must not
// keep the network's cursor row locked until the kernel gives its socket
// up, hours later: once its lease runs out, another replica claims the
// range. Here replica A's pass waits for a deposit's row held elsewhere,
// A is frozen there, and the row is let go, so A's transaction sits open
// holding the cursor.
func TestFrozenScannerLetsGoOfTheCursor(t *testing.T) {
	defer postgres.SetTxIdleMax(time.Second)()
	ctx := context.Background()
	f := newFixture(t)
	const network = "ETH_MAINNET"
	_, err := f.db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, 100))
	reorged := scannedDeposit(1)
	claim, ok, err := f.db.ClaimScanCursor(ctx, network, "setup", time.Minute, 10, 1000)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = f.db.CompleteScanPass(ctx, network, "setup", claim, []postgres.NewEvent{reorged})
	require.NoError(t, err)
	_, err = f.sql.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'reorged', chain_state = 'reorged' WHERE event_id = $1`, reorged.Event.ID)
	require.NoError(t, err)

	hold, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, reorged.Event.ID)
	require.NoError(t, err)

	const lease = 300 * time.Millisecond
	var claimA postgres.ScanClaim // read after A answers
	// A holds the cursor row and waits for the deposit's.
	freezer, doneA := f.frozenMidTransaction(t, hold, func(replicaA *postgres.DB) error {
		claim, ok, err := replicaA.ClaimScanCursor(ctx, network, "a", lease, 10, 1000)
		if err != nil || !ok {
			return fmt.Errorf("A's claim: %t, %w", ok, err)
		}
		claimA = claim
		_, err = replicaA.CompleteScanPass(ctx, network, "a", claim, []postgres.NewEvent{scannedDeposit(2), reorged})
		return err
	})
	time.Sleep(lease)

	var claimed bool
	var last error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !claimed; {
		claimCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, claimed, last = f.db.ClaimScanCursor(claimCtx, network, "b", time.Minute, 10, 1000)
		cancel()
	}
	require.True(t, claimed, "replica B never got the range A's lease gave up while A is frozen: %v", last)
	requireEndedWhileFrozen(t, freezer, doneA)
	_, err = f.db.Event(ctx, scannedDeposit(2).Event.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "A's pass stored nothing")
	next, _, _, err := f.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.Equal(t, claimA.From, next, "the cursor waits for B's pass")
}

// TestPausedPassAfterTakeoverStoresNothing: a scheduler paused (SIGSTOP, a
// suspended VM) past its lease, whose range or rescan job another one
// took over meanwhile, stores and moves nothing when it wakes, whether
// the other pass completed, failed and gave the lease back, or still
// holds it; its release and failure leave the other's lease alone.
func TestPausedPassAfterTakeoverStoresNothing(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	const network = "ETH_MAINNET"
	const lease = 50 * time.Millisecond
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	ev := postgres.NewEvent{Event: payment.Event{ID: "chain:ETH_MAINNET:0x" + strings.Repeat("cd", 32) + ":native", Type: payment.Deposit,
		UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"), TxHash: "0x" + strings.Repeat("cd", 32), TransferIndex: payment.TransferNative},
		Source: postgres.SourceScanner, ToAddress: "0x" + strings.Repeat("11", 20)}

	require.NoError(t, db.InitScanCursor(ctx, network, 100))
	paused, ok, err := db.ClaimScanCursor(ctx, network, "a", lease, 10, 1000)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(2 * lease)
	// b takes over, fails and gives the lease back: no owner.
	_, ok, err = db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 1000)
	require.NoError(t, err)
	require.True(t, ok, "the expired lease is taken over")
	require.NoError(t, db.ReleaseScanCursor(ctx, network, "b"))
	_, err = db.CompleteScanPass(ctx, network, "a", paused, []postgres.NewEvent{ev})
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "a released lease is not the paused pass's again")
	// b takes it again and holds it: a's release leaves it.
	claim, ok, err := db.ClaimScanCursor(ctx, network, "b", time.Minute, 10, 1000)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, db.ReleaseScanCursor(ctx, network, "a"))
	_, ok, err = db.ClaimScanCursor(ctx, network, "c", time.Minute, 10, 1000)
	require.NoError(t, err)
	require.False(t, ok, "a's release freed b's lease")
	_, err = db.CompleteScanPass(ctx, network, "b", claim, nil)
	require.NoError(t, err)
	_, err = db.CompleteScanPass(ctx, network, "a", paused, []postgres.NewEvent{ev})
	require.ErrorIs(t, err, postgres.ErrLeaseLost, "the range b completed")
	_, err = db.Event(ctx, ev.Event.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "the paused pass stored nothing")
	next, _, _, err := db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.EqualValues(t, 110, next, "the cursor moved once")

	_, err = db.CreateRescan(ctx, "r-paused", network, 10, 99, "op")
	require.NoError(t, err)
	pausedJob, ok, err := db.ClaimRescan(ctx, network, 1000, "a", lease)
	require.NoError(t, err)
	require.True(t, ok)
	time.Sleep(2 * lease)
	_, ok, err = db.ClaimRescan(ctx, network, 1000, "b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok, "the expired job lease is taken over")
	require.NoError(t, db.ReleaseRescan(ctx, "r-paused", "b"))
	_, err = db.CompleteRescanPass(ctx, "r-paused", "a", pausedJob.Next, 29, "", 0, []postgres.NewEvent{ev})
	require.ErrorIs(t, err, postgres.ErrLeaseLost)
	_, err = db.RestartRescan(ctx, "r-paused", "a", pausedJob.Next, 5, "paused")
	require.ErrorIs(t, err, postgres.ErrLeaseLost)
	_, ok, err = db.ClaimRescan(ctx, network, 1000, "b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, db.FailRescan(ctx, "r-paused", "a", "paused pass"))
	require.NoError(t, db.ReleaseRescan(ctx, "r-paused", "a"))
	_, err = db.CompleteRescanPass(ctx, "r-paused", "b", pausedJob.Next, 29, "", 0, nil)
	require.NoError(t, err, "b's lease survived a's failure and release")
	job, err := db.Rescan(ctx, "r-paused")
	require.NoError(t, err)
	require.Equal(t, "running", job.Status)
	require.EqualValues(t, 30, job.NextBlock)
	require.Zero(t, job.Restarts)
	_, err = db.Event(ctx, ev.Event.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "the paused rescan stored nothing")
}
