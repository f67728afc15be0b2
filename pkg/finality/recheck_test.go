package finality_test

import (
	"context"
	"fmt"
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

// recheckChain answers every deposit with one verdict or error.
type recheckChain struct {
	verdict chain.Verdict
	err     error
	asked   int
}

func (c *recheckChain) CheckDeposit(context.Context, chain.Deposit, chain.Policy) (chain.Verdict, error) {
	c.asked++
	return c.verdict, c.err
}

func (c *recheckChain) StillCanonical(context.Context, chain.Deposit, uint64, string) (chain.Canonicity, error) {
	return chain.Canonicity{State: chain.Canonical}, nil
}

type recheckFixture struct {
	t     *testing.T
	db    *postgres.DB
	sql   *pgx.Conn
	chain *recheckChain
	r     *finality.Rechecker
}

func newRecheckFixture(t *testing.T) *recheckFixture {
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
	ch := &recheckChain{}
	gate := finality.New(finality.Options{
		Store: db, Chain: ch, Assets: assets, Policy: chain.FinalizedPolicy(),
		Timeout: time.Hour, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	return &recheckFixture{t: t, db: db, sql: conn, chain: ch, r: finality.NewRechecker(gate, db)}
}

// failed stores a deposit of 1 ETH in transaction n that the chain
// decided against with outcome.
func (f *recheckFixture) failed(id string, n int, outcome payment.Outcome) {
	f.t.Helper()
	ctx := context.Background()
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
		TxHash: fmt.Sprintf("0x%064x", n), TraceID: "trace-" + id}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	require.Len(f.t, claimed, 1)
	moved, err := f.db.DecideChainOutcome(ctx, claimed[0].Event, outcome, "decided")
	require.NoError(f.t, err)
	require.True(f.t, moved)
}

func (f *recheckFixture) status(id string) string {
	f.t.Helper()
	var status string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT status FROM payment_events WHERE event_id = $1`, id).Scan(&status))
	return status
}

var finalCredit = chain.Verdict{State: chain.Credit, BlockNumber: 9, BlockHash: "0xb9", Finalized: true, ReceiptSeen: true,
	Reason: "block 9 is finalized", Transfers: []string{payment.TransferNative}}

func TestRecheckReopensAFinalUnclaimedTransferOnce(t *testing.T) {
	f := newRecheckFixture(t)
	ctx := context.Background()
	f.failed("nf-1", 1, payment.OutcomeNotFound)
	f.chain.verdict = finalCredit

	first, err := f.r.Recheck(ctx, "nf-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckReopened, first.Result)
	require.Equal(t, "credit", first.ChainState)
	require.Equal(t, payment.StatusPending, first.Status)
	require.Contains(t, first.Detail, "block 9")

	second, err := f.r.Recheck(ctx, "nf-1", "bob")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckNotApplicable, second.Result, "a reopened deposit is not rechecked")
	require.Equal(t, finality.ChainNotAsked, second.ChainState)
	require.Contains(t, second.Detail, "pending")
	require.Equal(t, 1, f.chain.asked, "the second recheck does not ask the chain")

	history, err := f.db.Rechecks(ctx, "nf-1")
	require.NoError(t, err)
	require.Len(t, history, 2)
	require.Equal(t, "alice", history[0].RequestedBy)
}

func TestRecheckLeavesWhatTheChainDoesNotShow(t *testing.T) {
	f := newRecheckFixture(t)
	ctx := context.Background()
	f.failed("mm-1", 2, payment.OutcomeMismatch)
	f.chain.verdict = chain.Verdict{State: chain.Mismatch, ReceiptSeen: true, Reason: "the transaction carries 2 base units, the deposit says 1"}
	got, err := f.r.Recheck(ctx, "mm-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckUnchanged, got.Result)
	require.Equal(t, "mismatch", got.ChainState)
	require.Contains(t, got.Detail, "carries 2 base units")
	require.Equal(t, "failed", f.status("mm-1"))

	f.chain.verdict, f.chain.err = chain.Verdict{}, payment.Unavailable("eth_getTransactionReceipt", fmt.Errorf("breaker open"))
	got, err = f.r.Recheck(ctx, "mm-1", "alice")
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.Equal(t, finality.ChainUnavailable, got.ChainState, "an outage is recorded too")
	require.Equal(t, postgres.RecheckUnchanged, got.Result)
	require.Equal(t, "failed", f.status("mm-1"))

	// Another outcome, no transaction, another type, and no event at all.
	f.chain.err = nil
	f.failed("dup-1", 3, payment.OutcomeDuplicateTransfer)
	got, err = f.r.Recheck(ctx, "dup-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckNotApplicable, got.Result)
	require.Contains(t, got.Detail, "duplicate_transfer")
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "w-1", Type: payment.Withdrawal, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("1"), TxHash: fmt.Sprintf("0x%064x", 4), TraceID: "t"}})
	require.NoError(t, err)
	require.True(t, inserted)
	got, err = f.r.Recheck(ctx, "w-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckNotApplicable, got.Result)
	require.Contains(t, got.Detail, "withdrawal")
	_, err = f.r.Recheck(ctx, "nobody", "alice")
	require.ErrorIs(t, err, payment.ErrNotFound)
}

// TestRecheckSparesAClaimedTransfer: the transfer the chain shows final is
// already credited to another event (by name, or by an unresolved claim
// of the same asset): the deposit stays failed and the answer names the
// holder.
func TestRecheckSparesAClaimedTransfer(t *testing.T) {
	f := newRecheckFixture(t)
	ctx := context.Background()
	f.failed("rg-1", 5, payment.OutcomeReorged)
	txHash := fmt.Sprintf("0x%064x", 5)
	f.chain.verdict = finalCredit
	f.chain.verdict.Transfers = []string{"3", "4"}

	_, err := f.sql.Exec(ctx, `INSERT INTO chain_transfers (network, tx_hash, transfer_index, asset, event_id) VALUES
		('ETH_MAINNET', $1, '3', 'ETH', 'holder-a'), ('ETH_MAINNET', $1, 'unresolved:holder-b', 'ETH', 'holder-b'),
		('ETH_MAINNET', $1, 'unresolved:other-asset', 'USDC', 'other-asset')`, txHash)
	require.NoError(t, err)
	got, err := f.r.Recheck(ctx, "rg-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckUnchanged, got.Result)
	require.Equal(t, "credit", got.ChainState)
	require.Contains(t, got.Detail, "holder-a, holder-b")
	require.Equal(t, "failed", f.status("rg-1"))

	// An unresolved claim of another asset holds nothing of this one.
	_, err = f.sql.Exec(ctx, `DELETE FROM chain_transfers WHERE event_id = 'holder-b'`)
	require.NoError(t, err)
	got, err = f.r.Recheck(ctx, "rg-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckReopened, got.Result)
	require.Equal(t, "pending", f.status("rg-1"))
}

// TestRecheckWatchesACompensatedDepositAgain: a deposit credited and then
// compensated for a reorg is rechecked; while the chain does not show it
// the recheck changes nothing, and once it shows the transfer final the
// deposit is watched again (given back when its block is finalized, see
// TestCompensatedDepositIsGivenBackWhenFinalAgain). A second recheck
// does nothing more.
func TestRecheckWatchesACompensatedDepositAgain(t *testing.T) {
	f := newRecheckFixture(t)
	ctx := context.Background()
	e := payment.Event{ID: "comp-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
		TxHash: fmt.Sprintf("0x%064x", 77), TraceID: "trace-comp-1"}
	_, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event, Chain: &postgres.ChainEvidence{
		BlockNumber: 7, BlockHash: fmt.Sprintf("0x%064x", 7), Watch: true, Transfers: []string{payment.TransferNative},
	}}}, postgres.LedgerOptions{})
	require.NoError(t, err)
	reversal, err := f.db.ReverseDeposit(ctx, "comp-1", "block 7 replaced", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Compensating, reversal)

	f.chain.verdict = chain.Verdict{State: chain.Wait, Reason: "no receipt"}
	r, err := f.r.Recheck(ctx, "comp-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckUnchanged, r.Result)
	var state string
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT chain_state FROM payment_events WHERE event_id = 'comp-1'`).Scan(&state))
	require.Equal(t, "reorged", state)

	f.chain.verdict = finalCredit
	r, err = f.r.Recheck(ctx, "comp-1", "alice")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckReopened, r.Result)
	require.Equal(t, payment.StatusConfirmed, r.Status)
	require.Contains(t, r.Detail, "given back once its block is finalized")
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT chain_state FROM payment_events WHERE event_id = 'comp-1'`).Scan(&state))
	require.Equal(t, "watching", state)

	r, err = f.r.Recheck(ctx, "comp-1", "bob")
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckNotApplicable, r.Result)
	require.Equal(t, 2, f.chain.asked, "the recheck of a deposit watched again does not ask the chain")
}
