package invariant_test

// States in which money moved wrongly while each table stays consistent
// with itself: only relating holds to their posts, compensations to their
// deposits, claims to their event's network and dead letters to their
// event's generation shows them.

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// settleEvent inserts e and runs it through the ledger alone.
func settleEvent(t *testing.T, db *postgres.DB, e postgres.NewEvent) {
	t.Helper()
	ctx := context.Background()
	_, err := db.InsertEvent(ctx, e)
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{})
	require.NoError(t, err)
}

func statusOf(t *testing.T, conn *pgx.Conn, id string) string {
	t.Helper()
	var s, o string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT status, COALESCE(outcome,'') FROM payment_events WHERE event_id = $1`, id).Scan(&s, &o))
	return s + "/" + o
}

func execAll(t *testing.T, conn *pgx.Conn, statements ...string) {
	t.Helper()
	for _, s := range statements {
		_, err := conn.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

func requireOK(t *testing.T, db *postgres.DB) {
	t.Helper()
	report, err := invariant.Check(context.Background(), db, invariant.Quiet())
	require.NoError(t, err)
	require.True(t, report.OK(), report.String())
}

func requireFailing(t *testing.T, db *postgres.DB, checks ...string) invariant.Report {
	t.Helper()
	report, err := invariant.Check(context.Background(), db, invariant.Quiet())
	require.NoError(t, err)
	require.ElementsMatch(t, checks, failing(report), report.String())
	return report
}

// forgedPost is a confirmed, journalled post of hold h1 that the ledger
// never applied: the user is debited 3 a second time.
var forgedPost = []string{
	`INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, hold_id)
	 VALUES ('p2', 'withdrawal_post', 1, 'ETH', 3, decode(repeat('00', 32), 'hex'), 'h1')`,
	`UPDATE payment_events SET status = 'enqueued' WHERE event_id = 'p2'`,
	`UPDATE payment_events SET status = 'confirmed', outcome = 'success' WHERE event_id = 'p2'`,
	`INSERT INTO balance_events (user_id, asset, amount, event_type, source_event_id) VALUES (1, 'ETH', -3, 'withdrawal', 'p2')`,
	`UPDATE balances SET balance = balance - 3 WHERE user_id = 1 AND asset = 'ETH'`,
}

func holdFixture(t *testing.T) (*postgres.DB, *pgx.Conn) {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("10")))
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3")}})
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	require.Equal(t, "confirmed/held", statusOf(t, conn, "h1"))
	return db, conn
}

// A hold resolves once: a second confirmed post of it debits the user
// twice for one withdrawal.
func TestCheckerCatchesSecondPostOfOneHold(t *testing.T) {
	db, conn := holdFixture(t)
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3"), HoldID: "h1"}})
	require.Equal(t, "confirmed/success", statusOf(t, conn, "p1"))
	requireOK(t, db)

	execAll(t, conn, forgedPost...)
	report := requireFailing(t, db, "every confirmed post or void resolved its hold", "at most one confirmed post or void per hold")
	require.Contains(t, report.String(), "h1: p1, p2")
}

// A confirmed, debited post whose hold is still open: the money left and
// is still reserved.
func TestCheckerCatchesPostWhoseHoldStaysOpen(t *testing.T) {
	db, conn := holdFixture(t)
	requireOK(t, db)
	execAll(t, conn, forgedPost...)
	report := requireFailing(t, db, "every confirmed post or void resolved its hold")
	require.Contains(t, report.String(), "p2 of h1")
}

// A void the hold names with the status of a post.
func TestCheckerCatchesResolutionOfAnotherKind(t *testing.T) {
	db, conn := holdFixture(t)
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "v1", Type: payment.WithdrawalVoid, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3"), HoldID: "h1"}})
	require.Equal(t, "confirmed/success", statusOf(t, conn, "v1"))
	requireOK(t, db)
	// A resolved hold's status is guarded; lifted for the tampering.
	execAll(t, conn,
		`ALTER TABLE holds DISABLE TRIGGER holds_transition_guard`,
		`UPDATE holds SET status = 'posted' WHERE hold_id = 'h1'`,
		`ALTER TABLE holds ENABLE TRIGGER holds_transition_guard`)
	requireFailing(t, db, "every confirmed post or void resolved its hold", "holds match their hold, post and void events")
}

// A post that debited less than its hold paid out: every table agrees
// with itself (the journal with the post, the balance with the journal,
// held with the open holds), so only the hold names the shortfall.
func TestCheckerCatchesPostOfAnotherAmount(t *testing.T) {
	db, conn := holdFixture(t)
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3"), HoldID: "h1"}})
	require.Equal(t, "confirmed/success", statusOf(t, conn, "p1"))
	requireOK(t, db)
	execAll(t, conn,
		`UPDATE payment_events SET amount = 1 WHERE event_id = 'p1'`,
		`UPDATE balance_events SET amount = -1 WHERE source_event_id = 'p1'`,
		`UPDATE balances SET balance = balance + 2 WHERE user_id = 1 AND asset = 'ETH'`)
	report := requireFailing(t, db, "holds match their hold, post and void events")
	require.Contains(t, report.String(), "e.g. h1")
}

// A post of one user's hold that debited another user: the owner's
// payout was paid for by someone else, each balance consistent with its
// journal.
func TestCheckerCatchesPostDebitingAnotherUser(t *testing.T) {
	db, conn := holdFixture(t)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 2)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 2, "ETH", decimal.RequireFromString("10")))
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3"), HoldID: "h1"}})
	require.Equal(t, "confirmed/success", statusOf(t, conn, "p1"))
	requireOK(t, db)
	execAll(t, conn,
		`UPDATE payment_events SET user_id = 2 WHERE event_id = 'p1'`,
		`UPDATE balance_events SET user_id = 2 WHERE source_event_id = 'p1'`,
		`UPDATE balances SET balance = balance + 3 WHERE user_id = 1 AND asset = 'ETH'`,
		`UPDATE balances SET balance = balance - 3 WHERE user_id = 2 AND asset = 'ETH'`)
	report := requireFailing(t, db, "holds match their hold, post and void events")
	require.Contains(t, report.String(), "e.g. h1")
}

// A confirmed hold ("held") that reserves nothing: its holds row is gone
// and held was lowered with it.
func TestCheckerCatchesConfirmedHoldWithoutItsRow(t *testing.T) {
	db, conn := holdFixture(t)
	execAll(t, conn,
		`DELETE FROM holds WHERE hold_id = 'h1'`,
		`UPDATE balances SET held = held - 3 WHERE user_id = 1 AND asset = 'ETH'`)
	report := requireFailing(t, db, "every confirmed withdrawal_hold has its holds row")
	require.Contains(t, report.String(), "e.g. h1")
}

// depositTx is d1's transaction: a deposit is given back only when its
// transfer is reported again, which names one.
const depositTx = "0xd100000000000000000000000000000000000000000000000000000000000000"

func reorgFixture(t *testing.T) (*postgres.DB, *pgx.Conn) {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("100")))
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "d1", Type: payment.Deposit, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("10"), TxHash: depositTx}})
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	require.Equal(t, "confirmed/success", statusOf(t, conn, "d1"))
	return db, conn
}

func compensation(cycle int, deposit, amount string) postgres.NewEvent {
	return postgres.NewEvent{
		Event:  payment.Event{ID: payment.CycleCompensationEventID(cycle, deposit), Type: payment.ReorgCompensation, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString(amount)},
		Source: postgres.SourceReorg, Related: deposit,
	}
}

func giveBack(cycle int, deposit, amount string) postgres.NewEvent {
	return postgres.NewEvent{
		Event:  payment.Event{ID: payment.ReturnEventID(cycle, deposit), Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString(amount)},
		Source: postgres.SourceReorg, Related: deposit,
	}
}

// applyQueued runs the one event waiting in the outbox through the ledger.
func applyQueued(t *testing.T, db *postgres.DB) {
	t.Helper()
	ctx := context.Background()
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{})
	require.NoError(t, err)
}

func reverse(t *testing.T, db *postgres.DB, want postgres.Reversal) {
	t.Helper()
	r, err := db.ReverseDeposit(context.Background(), "d1", "gone from the chain", "")
	require.NoError(t, err)
	require.Equal(t, want, r)
}

func giveBackD1(t *testing.T, db *postgres.DB, watch bool, want postgres.Return) {
	t.Helper()
	r, err := db.ReturnDeposit(context.Background(), "d1", payment.Transfer{Network: "ETH_MAINNET", TxHash: depositTx, Index: payment.TransferNative}, watch, "on the chain again")
	require.NoError(t, err)
	require.Equal(t, want, r)
}

func chainStateOf(t *testing.T, conn *pgx.Conn, id string) string {
	t.Helper()
	var s string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT COALESCE(chain_state, '') FROM payment_events WHERE event_id = $1`, id).Scan(&s))
	return s
}

// markReorged leaves d1 as ReverseDeposit does beside a compensation
// planted by hand.
func markReorged(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	execAll(t, conn, `UPDATE payment_events SET chain_state = 'reorged' WHERE event_id = 'd1'`)
}

// Cycles of reorgs and returns as settle runs them, each compensation
// reversing the deposit or the give-back before it, pass at every step:
// given back on the provider's word or once the watcher saw the transfer
// final, a compensation cancelled before it ran, and one the balance
// could not cover (dead-lettered: off the chain all the same).
func TestCheckerPassesReorgCycles(t *testing.T) {
	db, conn := reorgFixture(t)
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "reorg:d1"))
	require.Equal(t, "reorged", chainStateOf(t, conn, "d1"))
	requireOK(t, db)
	giveBackD1(t, db, false, postgres.GivenBack)
	applyQueued(t, db)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "return:1:d1"))
	require.Empty(t, chainStateOf(t, conn, "d1"))
	requireOK(t, db)

	// Watched again, off the chain until its transfer is final.
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	requireOK(t, db)
	giveBackD1(t, db, true, postgres.WatchedAgain)
	require.Equal(t, "watching", chainStateOf(t, conn, "d1"))
	requireOK(t, db)
	givenBack, err := db.MarkFinal(context.Background(), "d1")
	require.NoError(t, err)
	require.True(t, givenBack)
	applyQueued(t, db)
	require.Equal(t, "final", chainStateOf(t, conn, "d1"))
	requireOK(t, db)

	// Back on the chain before its compensation ran: cancelled, then run
	// after all when the transfer leaves again.
	reverse(t, db, postgres.Compensating)
	giveBackD1(t, db, false, postgres.GivenBack)
	require.Equal(t, "failed/reorged", statusOf(t, conn, "reorg:return:2:d1"))
	requireOK(t, db)
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "reorg:return:2:d1"))
	requireOK(t, db)
	giveBackD1(t, db, false, postgres.GivenBack)
	applyQueued(t, db)
	requireOK(t, db)

	// Uncovered: the user's available balance is held.
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("105")}})
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	require.Equal(t, "failed/dead_lettered", statusOf(t, conn, "reorg:return:3:d1"))
	require.Equal(t, "reorged", chainStateOf(t, conn, "d1"))
	requireOK(t, db)
}

// A deposit compensated twice for one reorg, with no give-back between:
// the user lost 10 more than the reorg took.
func TestCheckerCatchesDoubleCompensation(t *testing.T) {
	db, conn := reorgFixture(t)
	settleEvent(t, db, compensation(1, "d1", "10"))
	settleEvent(t, db, compensation(2, "d1", "10"))
	markReorged(t, conn)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "reorg:return:1:d1"))
	report := requireFailing(t, db, "a deposit is compensated at most once more than given back")
	require.Contains(t, report.String(), "d1: 2 compensation(s), 0 give-back(s)")
}

// A deposit whose reorgs leave it on the chain says so: chain_state
// 'reorged' with no compensation standing (never compensated, or given
// back) misreports money the user holds as taken back.
func TestCheckerCatchesReorgedDepositOnTheChain(t *testing.T) {
	db, conn := reorgFixture(t)
	requireOK(t, db)
	markReorged(t, conn)
	report := requireFailing(t, db, "a credited deposit's chain_state follows its reorg cycle")
	require.Contains(t, report.String(), "d1: chain_state reorged, never compensated")

	execAll(t, conn, `UPDATE payment_events SET chain_state = NULL WHERE event_id = 'd1'`)
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	giveBackD1(t, db, false, postgres.GivenBack)
	applyQueued(t, db)
	requireOK(t, db)
	markReorged(t, conn)
	report = requireFailing(t, db, "a credited deposit's chain_state follows its reorg cycle")
	require.Contains(t, report.String(), "d1: chain_state reorged, compensation 1 given back")
}

// A deposit compensated and not given back is off the chain: 'reorged'
// (or 'watching' again). Marked anything else, the next report of its
// transfer finds no compensated deposit (lock_compensated) and the
// money taken back is never given back.
func TestCheckerCatchesCompensatedDepositOnTheChain(t *testing.T) {
	db, conn := reorgFixture(t)
	reverse(t, db, postgres.Compensating)
	applyQueued(t, db)
	requireOK(t, db)
	for _, state := range []string{"'final'", "NULL"} {
		execAll(t, conn, `UPDATE payment_events SET chain_state = `+state+` WHERE event_id = 'd1'`)
		report := requireFailing(t, db, "a credited deposit's chain_state follows its reorg cycle")
		require.Contains(t, report.String(), "compensation 1 standing", state)
	}
	// As it was, it is given back when its transfer is reported again.
	markReorged(t, conn)
	requireOK(t, db)
	giveBackD1(t, db, false, postgres.GivenBack)
}

// A give-back of a cycle whose compensation never ran credits the deposit
// a second time.
func TestCheckerCatchesGiveBackWithoutCompensation(t *testing.T) {
	db, _ := reorgFixture(t)
	settleEvent(t, db, giveBack(1, "d1", "10"))
	requireFailing(t, db, "a deposit is compensated at most once more than given back")
}

// A compensation takes back what its deposit credited, from its user.
func TestCheckerCatchesCompensationOfAnotherAmount(t *testing.T) {
	db, conn := reorgFixture(t)
	settleEvent(t, db, compensation(1, "d1", "7"))
	markReorged(t, conn)
	report := requireFailing(t, db, "reorg compensations and give-backs match their deposit")
	require.Contains(t, report.String(), "reorg:d1 of d1")
}

// Invariant 5 names a transfer by (network, tx_hash, index): a Base
// deposit whose claim sits under ETH_MAINNET leaves its Base transfer
// unclaimed. A row from before networks (no network) is its asset's.
func TestCheckerCatchesClaimOnAnotherNetwork(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	tx := "0xab00000000000000000000000000000000000000000000000000000000000000"
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "d1", Type: payment.Deposit, UserID: 1, Asset: "USDC",
		Amount: decimal.RequireFromString("5"), TxHash: tx, Network: "BASE_MAINNET"}})
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "d1"))
	requireOK(t, db)

	execAll(t, conn, `UPDATE chain_transfers SET network = 'ETH_MAINNET' WHERE event_id = 'd1'`)
	report := requireFailing(t, db, "every chain_transfers row names one confirmed deposit")
	require.Contains(t, report.String(), "ETH_MAINNET:"+tx)

	// Without a network the deposit is its asset's (USDC's first listing
	// is on ETH_MAINNET), and the claim there is right.
	var assetNetwork string
	require.NoError(t, conn.QueryRow(ctx, `SELECT network FROM assets WHERE code = 'USDC'`).Scan(&assetNetwork))
	require.Equal(t, "ETH_MAINNET", assetNetwork)
	execAll(t, conn, `UPDATE payment_events SET network = NULL WHERE event_id = 'd1'`)
	requireOK(t, db)

	// A legacy Alchemy id names its network, and migration 0007 claimed
	// its transfer there.
	legacy := "alchemy:BASE_MAINNET:0xcd00000000000000000000000000000000000000000000000000000000000000:token:3"
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: legacy, Type: payment.Deposit, UserID: 1, Asset: "USDC",
		Amount: decimal.RequireFromString("2"), TxHash: "0xcd00000000000000000000000000000000000000000000000000000000000000", Network: "BASE_MAINNET"}})
	_, err = conn.Exec(ctx, `UPDATE payment_events SET network = NULL WHERE event_id = $1`, legacy)
	require.NoError(t, err)
	requireOK(t, db)
	execAll(t, conn, `UPDATE chain_transfers SET network = 'ARB_MAINNET' WHERE event_id LIKE 'alchemy:%'`)
	requireFailing(t, db, "every chain_transfers row names one confirmed deposit")
}

// A payout claim names its post's transfer on the post's network: one
// under another network leaves the transfer that paid the post free for
// a second post. A post naming no network is its asset's.
func TestCheckerCatchesPayoutClaimOnAnotherNetwork(t *testing.T) {
	db, conn := holdFixture(t)
	ctx := context.Background()
	tx := "0xef00000000000000000000000000000000000000000000000000000000000000"
	_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("3"), HoldID: "h1", TxHash: tx, Network: "ETH_MAINNET"}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	block := "0xb100000000000000000000000000000000000000000000000000000000000000"
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event,
		Chain: &postgres.ChainEvidence{BlockNumber: 7, BlockHash: block, Transfers: []string{payment.TransferNative}}}}, postgres.LedgerOptions{})
	require.NoError(t, err)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "p1"))
	var network string
	require.NoError(t, conn.QueryRow(ctx, `SELECT network FROM payout_transfers WHERE event_id = 'p1'`).Scan(&network))
	require.Equal(t, "ETH_MAINNET", network)
	requireOK(t, db)

	execAll(t, conn, `UPDATE payout_transfers SET network = 'BASE_MAINNET' WHERE event_id = 'p1'`)
	report := requireFailing(t, db, "every payout_transfers row names one confirmed post")
	require.Contains(t, report.String(), "BASE_MAINNET:"+tx+":native=p1")

	execAll(t, conn,
		`UPDATE payout_transfers SET network = 'ETH_MAINNET' WHERE event_id = 'p1'`,
		`UPDATE payment_events SET network = NULL WHERE event_id = 'p1'`)
	requireOK(t, db)
}

// A post is on its hold's network. One stored under another network
// (the api copies the hold's) would be checked and claimed there, and
// settle the hold with a payment on a chain the hold does not pay out on;
// the ledger refuses it (mismatch), so the state is planted: a post
// settled on the hold's network, then moved with its claim. A post naming
// no network is its asset's, as the ledger reads it.
func TestCheckerCatchesPostOnAnotherNetwork(t *testing.T) {
	db, conn := holdFixture(t)
	ctx := context.Background()
	var holdNetwork string
	require.NoError(t, conn.QueryRow(ctx, `SELECT network FROM holds WHERE hold_id = 'h1'`).Scan(&holdNetwork))
	require.Equal(t, "ETH_MAINNET", holdNetwork)
	tx := "0xef10000000000000000000000000000000000000000000000000000000000000"
	_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("3"), HoldID: "h1", TxHash: tx, Network: "ETH_MAINNET"}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	block := "0xb200000000000000000000000000000000000000000000000000000000000000"
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event,
		Chain: &postgres.ChainEvidence{BlockNumber: 7, BlockHash: block, Transfers: []string{payment.TransferNative}}}}, postgres.LedgerOptions{})
	require.NoError(t, err)
	require.Equal(t, "confirmed/success", statusOf(t, conn, "p1"))
	var claimNetwork string
	require.NoError(t, conn.QueryRow(ctx, `SELECT network FROM payout_transfers WHERE event_id = 'p1'`).Scan(&claimNetwork))
	require.Equal(t, "ETH_MAINNET", claimNetwork)
	requireOK(t, db)

	execAll(t, conn,
		`UPDATE payment_events SET network = 'BASE_MAINNET' WHERE event_id = 'p1'`,
		`UPDATE payout_transfers SET network = 'BASE_MAINNET' WHERE event_id = 'p1'`)
	report := requireFailing(t, db, "every confirmed post is on its hold's network")
	require.Contains(t, report.String(), "p1 on BASE_MAINNET, hold h1 on ETH_MAINNET")

	execAll(t, conn,
		`UPDATE payment_events SET network = 'ETH_MAINNET' WHERE event_id = 'p1'`,
		`UPDATE payout_transfers SET network = 'ETH_MAINNET' WHERE event_id = 'p1'`)
	requireOK(t, db)
	execAll(t, conn, `UPDATE payment_events SET network = NULL WHERE event_id = 'p1'`)
	requireOK(t, db)
}

// A void names its hold's network (the api copies it) or none. It moves
// no money, so the ledger takes one on another network; such a void, or
// a hold's network rewritten under it, is corruption the checker names.
func TestCheckerCatchesVoidOnAnotherNetwork(t *testing.T) {
	db, conn := holdFixture(t)
	settleEvent(t, db, postgres.NewEvent{Event: payment.Event{ID: "v1", Type: payment.WithdrawalVoid, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("3"), HoldID: "h1", Network: "ETH_MAINNET"}})
	require.Equal(t, "confirmed/success", statusOf(t, conn, "v1"))
	requireOK(t, db)

	execAll(t, conn, `UPDATE payment_events SET network = 'BASE_MAINNET' WHERE event_id = 'v1'`)
	report := requireFailing(t, db, "every confirmed void is on its hold's network")
	require.Contains(t, report.String(), "v1 on BASE_MAINNET, hold h1 on ETH_MAINNET")

	execAll(t, conn, `UPDATE payment_events SET network = NULL WHERE event_id = 'v1'`)
	requireOK(t, db)
}

// A dead-lettered event is explained by a letter of its failure, not by
// the replayed letter of an earlier one.
func TestCheckerCatchesDeadLetterOfEarlierGeneration(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "x", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1")}})
	require.NoError(t, err)
	fail := func() int64 {
		claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		e := claimed[0].Event
		moved, id, err := db.FailToDLQ(ctx, payment.DeadLetter{EventID: e.ID, EventType: string(e.Type), Error: "boom", Generation: e.Generation, Source: payment.SourceWorker})
		require.NoError(t, err)
		require.True(t, moved)
		return id
	}
	first := fail()
	requireOK(t, db)
	r, err := db.ReplayDeadLetter(ctx, first, "ops", "try again")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, r)
	second := fail()
	requireOK(t, db)

	// The second failure's letter gone: only the replayed first is left.
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DELETE FROM dead_letter_queue WHERE id = $1`, second)
	require.NoError(t, err)
	requireFailing(t, db, "failed events have a DLQ row or a business outcome")

	// A discarded letter of the current failure explains it: the event
	// stays failed for good.
	third := letterOfCurrentGeneration(t, db, conn)
	discarded, err := db.DiscardDeadLetter(ctx, third, "ops", "refunded by hand")
	require.NoError(t, err)
	require.True(t, discarded)
	requireOK(t, db)
}

// letterOfCurrentGeneration writes a letter of x's current generation
// without failing it again (it is failed already), as a drained fallback
// entry does.
func letterOfCurrentGeneration(t *testing.T, db *postgres.DB, conn *pgx.Conn) int64 {
	t.Helper()
	var generation int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT generation FROM payment_events WHERE event_id = 'x'`).Scan(&generation))
	ids, err := db.InsertDeadLetters(context.Background(), []payment.DeadLetter{{EventID: "x", EventType: "deposit", Error: "boom", Generation: generation, Source: payment.SourceDrain}})
	require.NoError(t, err)
	require.Len(t, ids, 1)
	return ids[0]
}
