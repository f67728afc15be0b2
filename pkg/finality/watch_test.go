package finality_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// scriptedChain answers StillCanonical with what the test set for each
// transaction.
type scriptedChain struct {
	waitingChain
	mu      sync.Mutex
	answers map[string]chain.Canonicity
	errs    map[string]error
	// once are answers given one call each, before the standing ones.
	once  map[string][]scriptedAnswer
	asked []string
	// deposits are what the watcher said each deposit claims.
	deposits []chain.Deposit
}

type scriptedAnswer struct {
	answer chain.Canonicity
	err    error
}

// then queues an answer for the next call about txHash only.
func (c *scriptedChain) then(txHash string, answer chain.Canonicity, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.once == nil {
		c.once = map[string][]scriptedAnswer{}
	}
	c.once[txHash] = append(c.once[txHash], scriptedAnswer{answer, err})
}

func (c *scriptedChain) set(txHash string, answer chain.Canonicity, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers[txHash], c.errs[txHash] = answer, err
}

// clear makes txHash canonical where it was seen again.
func (c *scriptedChain) clear(txHash string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.answers, txHash)
	delete(c.errs, txHash)
}

func (c *scriptedChain) StillCanonical(_ context.Context, d chain.Deposit, blockNumber uint64, blockHash string) (chain.Canonicity, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	txHash := d.TxHash
	c.asked = append(c.asked, txHash)
	c.deposits = append(c.deposits, d)
	if q := c.once[txHash]; len(q) > 0 {
		c.once[txHash] = q[1:]
		return q[0].answer, q[0].err
	}
	if err := c.errs[txHash]; err != nil {
		return chain.Canonicity{}, err
	}
	a, ok := c.answers[txHash]
	if !ok {
		return chain.Canonicity{State: chain.Canonical, BlockNumber: blockNumber, BlockHash: blockHash}, nil
	}
	return a, nil
}

func (c *scriptedChain) takeAsked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.asked
	c.asked = nil
	return out
}

type watchFixture struct {
	t     *testing.T
	db    *postgres.DB
	conn  *pgx.Conn
	chain *scriptedChain
	gate  *finality.Gate
}

func blockHash(n int) string { return fmt.Sprintf("0x%064x", 0xb000+n) }

func newWatchFixture(t *testing.T, delay time.Duration) *watchFixture {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)
	c := &scriptedChain{answers: map[string]chain.Canonicity{}, errs: map[string]error{}}
	gate := finality.New(finality.Options{
		Store: db, Chain: c, Assets: assets, Policy: chain.FinalizedPolicy(),
		ReorgRecheckDelay: delay, Alerts: noAlerts{}, Log: zerolog.Nop(),
		// The watcher never reads the worker's clock: a wild one changes nothing.
		Now: func() time.Time { return time.Now().Add(-72 * time.Hour) },
	})
	return &watchFixture{t: t, db: db, conn: conn, chain: c, gate: gate}
}

// credit credits a deposit of 1 ETH in block 7 before finality: watched.
func (f *watchFixture) credit(id, txHash string) {
	f.t.Helper()
	ctx := context.Background()
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"), TxHash: txHash, TraceID: "trace-" + id}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	require.Len(f.t, claimed, 1)
	results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event, Chain: &postgres.ChainEvidence{
		BlockNumber: 7, BlockHash: blockHash(7), Watch: true, Transfers: []string{payment.TransferNative},
	}}}, postgres.LedgerOptions{})
	require.NoError(f.t, err)
	require.Len(f.t, results, 1)
	require.Equal(f.t, payment.StatusConfirmed, results[0].Status)
}

type watchRow struct {
	ChainState  string
	BlockNumber int64
	BlockHash   string
	Absent      bool
	AbsentHead  *int64
}

func (f *watchFixture) row(id string) watchRow {
	f.t.Helper()
	var r watchRow
	require.NoError(f.t, f.conn.QueryRow(context.Background(), `SELECT chain_state, block_number, block_hash, absent_since IS NOT NULL, absent_head
		FROM payment_events WHERE event_id = $1`, id).Scan(&r.ChainState, &r.BlockNumber, &r.BlockHash, &r.Absent, &r.AbsentHead))
	return r
}

// compensations counts the reorg compensation events of a deposit.
func (f *watchFixture) compensations(id string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.conn.QueryRow(context.Background(), `SELECT count(*) FROM payment_events WHERE event_id = $1`, payment.CompensationEventID(id)).Scan(&n))
	return n
}

func (f *watchFixture) watch() {
	f.t.Helper()
	require.NoError(f.t, f.gate.WatchReorgs(context.Background()))
}

// backdateAbsence moves the recorded absence back on the database's clock,
// as the passing of time would.
func (f *watchFixture) backdateAbsence(id string, by time.Duration) {
	f.t.Helper()
	tag, err := f.conn.Exec(context.Background(), `UPDATE payment_events SET absent_since = absent_since - $2::interval WHERE event_id = $1 AND absent_since IS NOT NULL`,
		id, fmt.Sprintf("%d milliseconds", by.Milliseconds()))
	require.NoError(f.t, err)
	require.EqualValues(f.t, 1, tag.RowsAffected())
}

func absent(head uint64) chain.Canonicity {
	return chain.Canonicity{State: chain.Absent, BlockNumber: 7, BlockHash: blockHash(7), Head: head, Reason: "no receipt; block 7 still has its hash"}
}

// TestAbsenceNeedsTwoReadsDelayAndBlockApart: an absent receipt is
// recorded, not acted on; a canonical read forgets it; a second absence
// is evidence only once REORG_RECHECK_DELAY has passed on the database's
// clock and the head has moved on. Then the deposit is compensated once.
func TestAbsenceNeedsTwoReadsDelayAndBlockApart(t *testing.T) {
	f := newWatchFixture(t, 30*time.Second)
	tx := fmt.Sprintf("0x%064x", 0xabc)
	f.credit("absent", tx)
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 7, BlockHash: blockHash(7)}, f.row("absent"))

	f.chain.set(tx, absent(10), nil)
	f.watch()
	r := f.row("absent")
	require.True(t, r.Absent)
	require.EqualValues(t, 10, *r.AbsentHead)

	// A canonical read in between: the first absence was a lagging node.
	f.chain.set(tx, chain.Canonicity{State: chain.Canonical, BlockNumber: 7, BlockHash: blockHash(7)}, nil)
	f.watch()
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 7, BlockHash: blockHash(7)}, f.row("absent"))

	f.chain.set(tx, absent(10), nil)
	f.watch()
	f.chain.set(tx, absent(15), nil)
	f.watch() // a block apart, but not the delay
	require.Zero(t, f.compensations("absent"))
	require.EqualValues(t, 10, *f.row("absent").AbsentHead, "the first absence is kept")

	f.backdateAbsence("absent", 31*time.Second)
	f.chain.set(tx, absent(10), nil)
	f.watch() // the delay, but the same head
	require.Zero(t, f.compensations("absent"))

	f.chain.set(tx, absent(11), nil)
	f.watch()
	require.Equal(t, 1, f.compensations("absent"))
	require.Equal(t, "reorged", f.row("absent").ChainState)
	f.chain.takeAsked()
	f.watch()
	require.Equal(t, 1, f.compensations("absent"))
	require.Empty(t, f.chain.takeAsked(), "a reorged deposit is no longer watched")
}

// TestGoneCompensatesAtOnce: another block at the height and no receipt
// is evidence on the first read.
func TestGoneCompensatesAtOnce(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	tx := fmt.Sprintf("0x%064x", 0xdef)
	f.credit("gone", tx)
	f.chain.set(tx, chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "no receipt; block 7 now has another hash"}, nil)
	f.watch()
	require.Equal(t, 1, f.compensations("gone"))
	var reason string
	require.NoError(t, f.conn.QueryRow(context.Background(), `SELECT error FROM payment_events WHERE event_id = 'gone'`).Scan(&reason))
	require.Contains(t, reason, "block 7 now has another hash")
}

// TestLookedAtOnceMoreAfterCompensating: right after a compensation
// commits the watch asks the chain again. Seen in a block now (mined again
// while it compensated), the deposit is watched again, then given back at
// final; a read that fails leaves it compensated, and the pass goes on.
func TestLookedAtOnceMoreAfterCompensating(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	back, failing := fmt.Sprintf("0x%064x", 0x700), fmt.Sprintf("0x%064x", 0x701)
	f.credit("back", back)
	f.credit("failing", failing)
	gone := chain.Canonicity{State: chain.Gone, BlockNumber: 7, BlockHash: blockHash(7), Reason: "block 7 now has another hash"}
	f.chain.then(back, gone, nil)
	f.chain.then(back, chain.Canonicity{State: chain.Moved, BlockNumber: 9, BlockHash: blockHash(9)}, nil)
	f.chain.then(failing, gone, nil)
	f.chain.then(failing, chain.Canonicity{}, payment.Unavailable("chain", errors.New("timeout")))
	require.NoError(t, f.gate.WatchReorgs(context.Background()), "a failed look again is logged, not the pass's error")
	require.Equal(t, 1, f.compensations("back"))
	require.Equal(t, 1, f.compensations("failing"))
	require.Equal(t, "watching", f.row("back").ChainState, "in a block again: watched again")
	require.Equal(t, "reorged", f.row("failing").ChainState, "not seen again: stays compensated")
	testenv.SettleOutbox(t, f.db)

	f.chain.set(back, chain.Canonicity{State: chain.Moved, BlockNumber: 9, BlockHash: blockHash(9), Final: true}, nil)
	f.watch()
	require.Equal(t, watchRow{ChainState: "final", BlockNumber: 9, BlockHash: blockHash(9)}, f.row("back"))
	testenv.SettleOutbox(t, f.db)
	var balance string
	require.NoError(t, f.conn.QueryRow(context.Background(), `SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'ETH'`).Scan(&balance))
	require.True(t, decimal.RequireFromString(balance).Equal(decimal.NewFromInt(1)), "back given back, failing compensated: %s", balance)
	testenv.RequireInvariants(t, f.db)
}

// TestMovedKeepsCreditAndMovesEvidence: a transaction mined again in
// another block keeps its credit; its block number and hash follow it,
// any absence is forgotten, and it stops being watched once that block
// is final.
func TestMovedKeepsCreditAndMovesEvidence(t *testing.T) {
	f := newWatchFixture(t, time.Second)
	tx := fmt.Sprintf("0x%064x", 0x123)
	f.credit("moved", tx)
	f.chain.set(tx, absent(9), nil)
	f.watch()
	require.True(t, f.row("moved").Absent)

	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 6, BlockHash: blockHash(6)}, nil)
	f.watch()
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 6, BlockHash: blockHash(6)}, f.row("moved"))
	require.Zero(t, f.compensations("moved"))

	// An answer about the old block after the move changes nothing.
	_, _, err := f.db.MoveEvidence(context.Background(), "moved", blockHash(7), 8, blockHash(8), false)
	require.NoError(t, err)
	a, err := f.db.RecordAbsence(context.Background(), "moved", blockHash(7), 20, time.Second)
	require.NoError(t, err)
	require.Equal(t, postgres.Absence{}, a)
	require.Equal(t, watchRow{ChainState: "watching", BlockNumber: 6, BlockHash: blockHash(6)}, f.row("moved"))

	f.chain.set(tx, chain.Canonicity{State: chain.Moved, BlockNumber: 8, BlockHash: blockHash(8), Final: true}, nil)
	f.watch()
	require.Equal(t, watchRow{ChainState: "final", BlockNumber: 8, BlockHash: blockHash(8)}, f.row("moved"))
	require.Zero(t, f.compensations("moved"))
	var balance string
	require.NoError(t, f.conn.QueryRow(context.Background(), `SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'ETH'`).Scan(&balance))
	require.True(t, decimal.RequireFromString(balance).Equal(decimal.NewFromInt(1)))
}

// TestWatchErrorsAreNotEvidence: a deposit the chain cannot be asked
// about goes to the back of the list, untouched otherwise; an invalid
// answer does not stop the pass, an outage does. The pass says so.
func TestWatchErrorsAreNotEvidence(t *testing.T) {
	f := newWatchFixture(t, time.Millisecond)
	txs := make([]string, 3)
	for i := range txs {
		txs[i] = fmt.Sprintf("0x%064x", 0x500+i)
		f.credit(fmt.Sprintf("err-%d", i), txs[i])
	}
	f.chain.set(txs[1], absent(9), nil)
	f.watch()
	require.True(t, f.row("err-1").Absent)
	f.chain.takeAsked()

	f.chain.set(txs[0], chain.Canonicity{}, payment.Invalid("bad stored hash"))
	f.chain.set(txs[1], chain.Canonicity{}, payment.Unavailable("chain", errors.New("timeout")))
	err := f.gate.WatchReorgs(context.Background())
	require.ErrorIs(t, err, payment.ErrInvalid)
	asked := f.chain.takeAsked()
	require.Len(t, asked, 2, "the outage ended the pass")
	require.True(t, f.row("err-1").Absent, "an error neither clears nor confirms an absence")
	require.Zero(t, f.compensations("err-1"))

	// Both went to the back: the next pass starts with the other one.
	f.chain.clear(txs[0])
	f.chain.set(txs[1], absent(10), nil)
	f.watch()
	// err-1 is asked once more just after its compensation commits, in
	// case the transaction was mined again meanwhile (still absent: it
	// stays compensated).
	require.Equal(t, []string{txs[2], txs[0], txs[1], txs[1]}, f.chain.takeAsked())
	require.Equal(t, 1, f.compensations("err-1"), "absent again, past the delay and a block later")
	require.Equal(t, "reorged", f.row("err-1").ChainState)
	require.Zero(t, f.compensations("err-0"))
}

// TestWatcherAsksWithTheDepositsClaim: the watcher hands the chain what
// the deposit claims (transaction, amount in base units, recipient), so
// a transaction mined again elsewhere keeps its credit only if it still
// pays that; a deposit the watcher cannot describe is an error, sent to
// the back of the list, and the others are still watched.
func TestWatcherAsksWithTheDepositsClaim(t *testing.T) {
	f := newWatchFixture(t, time.Hour)
	ctx := context.Background()
	tx, other := fmt.Sprintf("0x%064x", 0x600), fmt.Sprintf("0x%064x", 0x601)
	f.credit("claim", tx)
	f.credit("claim-other", other)
	const to = "0x00000000000000000000000000000000000c1a17"
	_, err := f.conn.Exec(ctx, `UPDATE payment_events SET to_address = $2 WHERE event_id = $1`, "claim", to)
	require.NoError(t, err)
	// The claim's log position, as a token's claim holds it.
	_, err = f.conn.Exec(ctx, `UPDATE chain_transfers SET log_position = 4 WHERE event_id = $1`, "claim")
	require.NoError(t, err)
	f.watch()
	require.Len(t, f.chain.deposits, 2)
	d := f.chain.deposits[0]
	require.Equal(t, tx, d.TxHash)
	require.Equal(t, "1000000000000000000", d.Amount.String(), "1 ETH in wei")
	require.Equal(t, []string{to}, d.Recipients)
	require.Empty(t, d.Token)
	require.NotNil(t, d.LogPosition, "the claim's position")
	require.EqualValues(t, 4, *d.LogPosition)
	require.Nil(t, f.chain.deposits[1].LogPosition, "a claim without one")
	f.chain.deposits = nil
	f.chain.takeAsked()

	// A worker whose registry lacks the asset cannot say what the deposit
	// claims: an error, not a state; nothing is decided.
	blind := finality.New(finality.Options{
		Store: f.db, Chain: f.chain, Assets: payment.NewRegistry(nil), Policy: chain.FinalizedPolicy(),
		ReorgRecheckDelay: time.Hour, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	err = blind.WatchReorgs(ctx)
	require.ErrorIs(t, err, payment.ErrInvalid)
	require.Empty(t, f.chain.takeAsked())
	for _, id := range []string{"claim", "claim-other"} {
		require.Equal(t, "watching", f.row(id).ChainState)
		require.Zero(t, f.compensations(id))
	}
}
