//go:build !fuzzing

package finality_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// timeoutFixture is a gate over a manual dev chain behind a lying proxy
// and real PostgreSQL, for deposits that outlive FINALITY_TIMEOUT.
type timeoutFixture struct {
	t      *testing.T
	ctx    context.Context
	ch     *devchain.Chain
	proxy  *devchain.Proxy
	client *chain.Client
	db     *postgres.DB
	conn   *pgx.Conn
	gate   *finality.Gate
	to     string
}

func newTimeoutFixture(t *testing.T) *timeoutFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	proxy, err := devchain.NewProxy(ch.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	client, err := chain.Dial(ctx, proxy.URL(), chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	checker := chain.NewChecker(client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork})

	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)
	require.NoError(t, ch.CommitBlocks(ctx, 2))
	gate := finality.New(finality.Options{
		Store: db, Chain: checker, Assets: assets, Policy: chain.FinalizedPolicy(),
		Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		ReorgRecheckDelay: 30 * time.Second, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	return &timeoutFixture{t: t, ctx: ctx, ch: ch, proxy: proxy, client: client, db: db, conn: conn, gate: gate, to: ch.Accounts()[1].Address}
}

// deposit sends 1 ETH from account from and stores its deposit event.
func (f *timeoutFixture) deposit(id string, from int) devchain.Tx {
	f.t.Helper()
	tx, err := f.ch.SendETH(f.ctx, from, f.to, big.NewInt(1e18))
	require.NoError(f.t, err)
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
		TxHash: tx.Hash, TraceID: "trace-" + id, Network: payment.DefaultNetwork}
	inserted, err := f.db.InsertEvent(f.ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments, ToAddress: f.to})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	return tx
}

// check claims the deposit's task and runs the gate on it: nothing is
// final here, so nothing is ever handed to the ledger.
func (f *timeoutFixture) check() {
	f.t.Helper()
	var claimed []postgres.Claimed
	for range 100 {
		var err error
		claimed, err = f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
		require.NoError(f.t, err)
		if len(claimed) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Len(f.t, claimed, 1)
	credit, err := f.gate.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(f.t, err)
	require.Nil(f.t, credit, "not final: nothing to credit")
}

// checkItem claims the deposit's task and runs the gate on it: the item
// to credit, or nil.
func (f *timeoutFixture) checkItem() *postgres.LedgerItem {
	f.t.Helper()
	var claimed []postgres.Claimed
	for range 100 {
		var err error
		claimed, err = f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
		require.NoError(f.t, err)
		if len(claimed) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Len(f.t, claimed, 1)
	credit, err := f.gate.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(f.t, err)
	return credit
}

// state is the deposit's status/outcome and its error text.
func (f *timeoutFixture) state(id string) (string, string) {
	f.t.Helper()
	var status, outcome, reason string
	require.NoError(f.t, f.conn.QueryRow(f.ctx, `SELECT status, COALESCE(outcome, ''), COALESCE(error, '') FROM payment_events WHERE event_id = $1`, id).
		Scan(&status, &outcome, &reason))
	return status + "/" + outcome, reason
}

// expire moves the deposit's creation FINALITY_TIMEOUT and more into the
// past, on the database's clock.
func (f *timeoutFixture) expire(id string) {
	f.t.Helper()
	_, err := f.conn.Exec(f.ctx, `UPDATE payment_events SET created_at = created_at - interval '2 hours' WHERE event_id = $1`, id)
	require.NoError(f.t, err)
}

// TestTimeoutSingleNullIsNotReorged: a deposit mined and canonical, only
// slow to finalize past FINALITY_TIMEOUT, is checked while one backend
// answers null for its receipt. A single null is never evidence: the gate
// asks the chain where the receipt was seen, finds it, and keeps waiting.
// An outage while asking decides nothing either. A node that keeps
// answering null while the block is unchanged is evidence only on a
// second read REORG_RECHECK_DELAY and one new block after the first.
func TestTimeoutSingleNullIsNotReorged(t *testing.T) {
	f := newTimeoutFixture(t)
	tx := f.deposit("slow-final", 0)
	f.check() // mined, not final: waits, receipt seen
	status, _ := f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status)
	f.expire("slow-final")
	f.check() // slow finality alone fails nothing
	status, _ = f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status)

	f.proxy.NullReceipt(tx.Hash, 1) // one lagging answer
	f.check()
	status, _ = f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status, "one null receipt ended a canonical deposit")

	// No receipt twice, and no header where it was seen: unavailable.
	f.proxy.NullReceipt(tx.Hash, 2)
	f.proxy.Answer("eth_getBlockByNumber", fmt.Sprintf("0x%x", tx.BlockNumber), json.RawMessage(`"not a block"`), 1)
	f.check()
	status, reason := f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status)
	require.Contains(t, reason, "chain unavailable for the reorg evidence")

	// A node that lost the receipt while its block stands: absent, then
	// evidence once the delay and a new block have passed.
	f.proxy.NullReceipt(tx.Hash, devchain.Forever)
	f.check()
	status, reason = f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status, "the first absence is not evidence")
	require.Contains(t, reason, "not evidence yet")
	f.check()
	status, _ = f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status, "a second read at once is not evidence")
	_, err := f.conn.Exec(f.ctx, `UPDATE payment_events SET absent_since = absent_since - interval '31 seconds' WHERE event_id = $1`, "slow-final")
	require.NoError(t, err)
	f.check()
	status, _ = f.state("slow-final")
	require.Equal(t, "awaiting_finality/", status, "the delay, but no new block")
	require.NoError(t, f.ch.CommitBlocks(f.ctx, 1))
	f.check()
	status, reason = f.state("slow-final")
	require.Equal(t, "failed/reorged", status)
	require.Contains(t, reason, fmt.Sprintf("receipt seen in block %d %s, then absent on reads", tx.BlockNumber, tx.BlockHash))
}

// TestTimeoutReceiptBackForgetsAbsence: an absence noted after the
// timeout is forgotten once the receipt is seen again, so a later null
// starts the two reads afresh.
func TestTimeoutReceiptBackForgetsAbsence(t *testing.T) {
	f := newTimeoutFixture(t)
	tx := f.deposit("back", 0)
	f.check()
	f.expire("back")
	f.proxy.NullReceipt(tx.Hash, 2)
	f.check()
	var absent bool
	require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT absent_since IS NOT NULL FROM payment_events WHERE event_id = 'back'`).Scan(&absent))
	require.True(t, absent)
	f.check() // the honest node again
	require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT absent_since IS NOT NULL FROM payment_events WHERE event_id = 'back'`).Scan(&absent))
	require.False(t, absent, "seen again: the absence was a lagging node")
	status, _ := f.state("back")
	require.Equal(t, "awaiting_finality/", status)
}

// TestTimeoutDroppedIsReorged: a real fork drops a deposit's transaction
// after its receipt was seen; past FINALITY_TIMEOUT the block where it
// was seen has another hash without it and its receipt is absent there
// too: reorged at once.
func TestTimeoutDroppedIsReorged(t *testing.T) {
	f := newTimeoutFixture(t)
	tx := f.deposit("dropped", 0)
	f.check()
	_, err := f.ch.Reorg(f.ctx, tx.Hash)
	require.NoError(t, err)
	f.expire("dropped")
	f.check()
	status, reason := f.state("dropped")
	require.Equal(t, "failed/reorged", status)
	require.Contains(t, reason, fmt.Sprintf("receipt seen, then gone: no receipt; block %d now has hash", tx.BlockNumber))
}

// TestMinedJustAfterFailingIsReopened: past FINALITY_TIMEOUT a deposit's
// transaction is not found (here: null receipts, as reads just before it
// was mined give) on reads the delay and a new block apart, and the
// deposit fails not_found. The gate asks once more after that commit:
// mined now, the deposit is reopened, as a report of it would have done
// had it not come while the deposit still waited. Still not found on that
// read, it stays failed.
func TestMinedJustAfterFailingIsReopened(t *testing.T) {
	f := newTimeoutFixture(t)
	gone := f.deposit("gone", 1)
	f.expire("gone")
	f.proxy.NullReceipt(gone.Hash, 1)
	f.check() // the first null read only starts the two reads
	status, _ := f.state("gone")
	require.Equal(t, "awaiting_finality/", status)
	f.ageAbsence("gone")
	f.proxy.NullReceipt(gone.Hash, 2)
	f.check()
	status, _ = f.state("gone")
	require.Equal(t, "failed/not_found", status, "not on the chain on the second read either")

	generation := func() int {
		t.Helper()
		var g int
		require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT generation FROM payment_events WHERE event_id = 'late'`).Scan(&g))
		return g
	}
	late := f.deposit("late", 0)
	f.expire("late")
	f.proxy.NullReceipt(late.Hash, 1)
	f.check()
	f.ageAbsence("late")
	before := generation()
	f.proxy.NullReceipt(late.Hash, 1)
	f.check()
	status, reason := f.state("late")
	require.Equal(t, "pending/", status, "reopened")
	require.Contains(t, reason, fmt.Sprintf("the transaction is in block %d, seen just after the deposit failed not_found", late.BlockNumber))
	require.Equal(t, before+1, generation(), "a new generation for the reopened deposit")
}

// ageAbsence moves a deposit's first recorded absence past
// REORG_RECHECK_DELAY and commits a new block, so the next null read is
// evidence.
func (f *timeoutFixture) ageAbsence(id string) {
	f.t.Helper()
	tag, err := f.conn.Exec(f.ctx, `UPDATE payment_events SET absent_since = absent_since - interval '31 seconds' WHERE event_id = $1 AND absent_since IS NOT NULL`, id)
	require.NoError(f.t, err)
	require.EqualValues(f.t, 1, tag.RowsAffected(), "no absence recorded")
	require.NoError(f.t, f.ch.CommitBlocks(f.ctx, 1))
}

// TestLateFirstCheckNullsAreNotNotFound: a deposit first checked after
// FINALITY_TIMEOUT (it waited in queues) meets a backend that answers
// null receipts for a while. Null reads are not_found only when they are
// REORG_RECHECK_DELAY and a new block apart: here the real receipt comes
// first, which forgets the absence, and the deposit is credited once
// final.
func TestLateFirstCheckNullsAreNotNotFound(t *testing.T) {
	f := newTimeoutFixture(t)
	tx := f.deposit("late-first", 0)
	f.expire("late-first")
	f.proxy.NullReceipt(tx.Hash, 3)
	for range 3 {
		f.check()
		status, reason := f.state("late-first")
		require.Equal(t, "awaiting_finality/", status, "null receipts read at once failed a canonical deposit")
		require.Contains(t, reason, "not evidence of not_found yet")
	}
	f.check() // the receipt, not final yet
	var absent bool
	require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT absent_since IS NOT NULL FROM payment_events WHERE event_id = 'late-first'`).Scan(&absent))
	require.False(t, absent, "the receipt seen forgets the absence")
	require.NoError(t, f.ch.FinalizeThrough(f.ctx, tx.BlockNumber))
	credit := f.checkItem()
	require.NotNil(t, credit, "final: credited")
	require.Equal(t, tx.BlockHash, credit.Chain.BlockHash)
}

// TestLateFirstCheckAbsentIsNotFound: a transaction no node knows, first
// checked past FINALITY_TIMEOUT, fails not_found once its receipt is
// absent on reads REORG_RECHECK_DELAY and a new block apart; an outage
// meanwhile decides nothing.
func TestLateFirstCheckAbsentIsNotFound(t *testing.T) {
	f := newTimeoutFixture(t)
	f.deposit("absent", 1)
	_, err := f.conn.Exec(f.ctx, `UPDATE payment_events SET tx_hash = $1 WHERE event_id = 'absent'`, "0x"+strings.Repeat("ab", 32))
	require.NoError(t, err)
	f.expire("absent")
	f.check()
	status, _ := f.state("absent")
	require.Equal(t, "awaiting_finality/", status, "the first absence is not evidence")
	f.check()
	status, _ = f.state("absent")
	require.Equal(t, "awaiting_finality/", status, "a second read at once is not evidence")
	_, err = f.conn.Exec(f.ctx, `UPDATE payment_events SET absent_since = absent_since - interval '31 seconds' WHERE event_id = 'absent'`)
	require.NoError(t, err)
	f.check()
	status, _ = f.state("absent")
	require.Equal(t, "awaiting_finality/", status, "the delay, but no new block")
	require.NoError(t, f.ch.CommitBlocks(f.ctx, 1))
	f.proxy.Answer("eth_getBlockByNumber", "latest", json.RawMessage(`"not a block"`), 1)
	f.check()
	status, reason := f.state("absent")
	require.Equal(t, "awaiting_finality/", status, "an outage decides nothing")
	require.Contains(t, reason, "chain unavailable")
	f.check()
	status, reason = f.state("absent")
	require.Equal(t, "failed/not_found", status)
	require.Contains(t, reason, "transaction not found within 1h0m0s: no receipt on reads")
}

// TestStaleReceiptAfterReorgDoesNotReopen: a fork drops a deposit's
// transaction and it fails reorged; on the gate's read after that, one
// backend still serves the receipt from the dropped block. The headers do
// not show that block, so the deposit is not reopened on its word.
func TestStaleReceiptAfterReorgDoesNotReopen(t *testing.T) {
	f := newTimeoutFixture(t)
	tx := f.deposit("stale", 0)
	f.check()
	node, err := rpc.DialContext(f.ctx, f.ch.URL())
	require.NoError(t, err)
	defer node.Close()
	var stale json.RawMessage
	require.NoError(t, node.CallContext(f.ctx, &stale, "eth_getTransactionReceipt", tx.Hash))
	require.NotEqual(t, "null", string(stale))
	_, err = f.ch.Reorg(f.ctx, tx.Hash)
	require.NoError(t, err)
	f.expire("stale")
	null := json.RawMessage("null")
	// The decision's three reads see it gone; the two after, the old receipt.
	f.proxy.Script("eth_getTransactionReceipt", tx.Hash, null, null, null, stale, stale)
	f.check()
	status, _ := f.state("stale")
	require.Equal(t, "failed/reorged", status, "a receipt the headers do not show reopens nothing")
	require.EqualValues(t, 5, f.proxy.Told("eth_getTransactionReceipt"))
}
