//go:build !fuzzing

package finality_test

import (
	"math/big"

	"testing"
	"time"

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

// givebackChain is a dev chain over JSON-RPC (behind a proxy that can lie)
// with one deposit, "again", credited at one confirmation and watched.
type givebackChain struct {
	*timeoutFixture
	gate *finality.Gate
	tx   devchain.Tx
}

func newGivebackChain(t *testing.T) *givebackChain {
	f := newTimeoutFixture(t)
	assets, err := f.db.Assets(f.ctx)
	require.NoError(t, err)
	policy, err := chain.ConfirmationsPolicy(1)
	require.NoError(t, err)
	checker := chain.NewChecker(f.client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork})
	g := &givebackChain{timeoutFixture: f, gate: finality.New(finality.Options{
		Store: f.db, Chain: checker, Assets: assets, Policy: policy,
		Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		ReorgRecheckDelay: 30 * time.Second, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})}
	g.tx = f.deposit("again", 0)
	require.NoError(t, f.ch.CommitBlocks(f.ctx, 2))
	claimed, err := f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	credit, err := g.gate.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(t, err)
	require.NotNil(t, credit, "one confirmation: credited")
	_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credit}, postgres.LedgerOptions{})
	require.NoError(t, err)
	require.Equal(t, "watching", g.chainState())
	require.True(t, decimal.NewFromInt(1).Equal(g.balance()))
	return g
}

func (g *givebackChain) balance() decimal.Decimal {
	g.t.Helper()
	var text string
	require.NoError(g.t, g.conn.QueryRow(g.ctx, `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'ETH'), '0')`).Scan(&text))
	return decimal.RequireFromString(text)
}

func (g *givebackChain) chainState() string {
	g.t.Helper()
	var s string
	require.NoError(g.t, g.conn.QueryRow(g.ctx, `SELECT COALESCE(chain_state, '') FROM payment_events WHERE event_id = 'again'`).Scan(&s))
	return s
}

func (g *givebackChain) exists(id string) bool {
	g.t.Helper()
	var n int
	require.NoError(g.t, g.conn.QueryRow(g.ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
	return n == 1
}

// finalGiveBack finalizes the block the transaction was mined again in
// and checks that the watch gives the deposit back, once.
func (g *givebackChain) finalGiveBack(mined devchain.Tx) {
	t := g.t
	t.Helper()
	require.NoError(t, g.ch.FinalizeThrough(g.ctx, mined.BlockNumber))
	require.NoError(t, g.gate.WatchReorgs(g.ctx))
	require.Equal(t, "final", g.chainState())
	require.True(t, g.exists(payment.ReturnEventID(1, "again")))
	require.NoError(t, g.gate.WatchReorgs(g.ctx))
	testenv.SettleOutbox(t, g.db)
	require.True(t, decimal.NewFromInt(1).Equal(g.balance()), "credited once: credit, compensation, give-back")
	testenv.RequireInvariants(t, g.db)
}

// TestDroppedThenMinedAgainIsGivenBack, on a real dev chain over JSON-RPC:
// a deposit credited at one confirmation is dropped by a reorg and
// compensated; its very transaction is mined again a few blocks later and
// reported again. It is watched again and given back only once its new
// block is finalized: the user ends with the deposit credited once.
func TestDroppedThenMinedAgainIsGivenBack(t *testing.T) {
	g := newGivebackChain(t)
	f, gate, tx := g.timeoutFixture, g.gate, g.tx
	balance, chainState, exists := g.balance, g.chainState, g.exists

	_, raw, err := f.ch.Drop(f.ctx, tx.Hash)
	require.NoError(t, err)
	for range 3 { // a null after a fork is read once more first
		require.NoError(t, gate.WatchReorgs(f.ctx))
		if exists(payment.CompensationEventID("again")) {
			break
		}
	}
	require.Equal(t, "reorged", chainState())
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(balance()), "compensated")

	mined, err := f.ch.Resend(f.ctx, raw)
	require.NoError(t, err)
	require.Equal(t, tx.Hash, mined.Hash)
	require.NotEqual(t, tx.BlockHash, mined.BlockHash)
	back, err := f.db.ReturnDeposit(f.ctx, "again", payment.Transfer{}, true, "reported again")
	require.NoError(t, err)
	require.Equal(t, postgres.WatchedAgain, back)

	require.NoError(t, gate.WatchReorgs(f.ctx))
	require.Equal(t, "watching", chainState(), "mined again, not final yet")
	require.False(t, exists(payment.ReturnEventID(1, "again")))
	var block int64
	require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT block_number FROM payment_events WHERE event_id = 'again'`).Scan(&block))
	require.EqualValues(t, mined.BlockNumber, block, "the evidence follows the transaction")

	g.finalGiveBack(mined)
}

// TestMinedAgainBeforeTheCompensationCommitsIsWatched: the watch reads
// the transaction gone (here: two null receipts, as a read just before
// the re-mine gives), and by the time its compensation commits the
// transaction is mined again, and was already scanned or re-reported
// while the deposit was credited, so nobody reports it again. The watch
// looks once more after the commit, sees it, and watches the deposit
// again: given back once final.
func TestMinedAgainBeforeTheCompensationCommitsIsWatched(t *testing.T) {
	g := newGivebackChain(t)
	_, raw, err := g.ch.Drop(g.ctx, g.tx.Hash)
	require.NoError(t, err)
	mined, err := g.ch.Resend(g.ctx, raw)
	require.NoError(t, err)
	require.NotEqual(t, g.tx.BlockNumber, mined.BlockNumber, "mined again at another height, so the old one's block lacks it")
	g.proxy.NullReceipt(g.tx.Hash, 2) // the watch's two reads, before the re-mine
	require.NoError(t, g.gate.WatchReorgs(g.ctx))
	require.True(t, g.exists(payment.CompensationEventID("again")), "compensated on the stale read")
	require.Equal(t, "watching", g.chainState(), "seen again just after the compensation: watched again")
	testenv.SettleOutbox(t, g.db)
	require.True(t, decimal.Zero.Equal(g.balance()), "compensated until the give-back")

	require.NoError(t, g.gate.WatchReorgs(g.ctx))
	require.Equal(t, "watching", g.chainState(), "mined again, not final yet")
	var block int64
	require.NoError(t, g.conn.QueryRow(g.ctx, `SELECT block_number FROM payment_events WHERE event_id = 'again'`).Scan(&block))
	require.EqualValues(t, mined.BlockNumber, block, "the evidence follows the transaction")
	g.finalGiveBack(mined)
}

// TestTokenMinedAgainAtAnotherLogIndexIsGivenBack, on a real dev chain: a
// token deposit credited at one confirmation as the block's only log
// (index 0) is dropped by a reorg and compensated; its transaction is
// mined again behind another token transfer, so its Transfer is log 1
// there. The provider's report of that log is a new chain: id, whose
// index no claim names: it still finds the compensated deposit (by its
// transaction), which is watched again and given back once final, while
// the new event ends duplicate_transfer. The user ends credited once.
func TestTokenMinedAgainAtAnotherLogIndexIsGivenBack(t *testing.T) {
	t.Run("reported", func(t *testing.T) { tokenMinedAgain(t, false) })
	t.Run("rechecked", func(t *testing.T) { tokenMinedAgain(t, true) })
}

// tokenMinedAgain: the deposit is found again by a provider's report, or
// by an operator's recheck, which asks the chain for any Transfer log of
// the transaction that pays it (the stored log index names another log
// in the new block).
func tokenMinedAgain(t *testing.T, recheck bool) {
	tc := newTokenChain(t)
	f, ctx, gate, token, apply, report, balance := tc.timeoutFixture, tc.ctx, tc.gate, tc.token, tc.apply, tc.report, tc.balance
	tx, err := f.ch.TransferToken(ctx, 0, token, f.to, big.NewInt(5_000_000))
	require.NoError(t, err)
	first := report(tx, "0")
	require.NoError(t, f.ch.CommitBlocks(ctx, 2))
	require.Equal(t, payment.OutcomeSuccess, apply(first).Outcome)
	require.True(t, decimal.NewFromInt(5).Equal(balance()))

	_, raw, err := f.ch.Drop(ctx, tx.Hash)
	require.NoError(t, err)
	for range 3 { // a null after a fork is read once more first
		require.NoError(t, gate.WatchReorgs(ctx))
		var n int
		require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, payment.CompensationEventID(first)).Scan(&n))
		if n == 1 {
			break
		}
	}
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.Zero.Equal(balance()), "compensated")

	_, err = f.ch.QueueTokenTransfer(ctx, 2, token, f.ch.Accounts()[3].Address, big.NewInt(1))
	require.NoError(t, err)
	mined, err := f.ch.Resend(ctx, raw)
	require.NoError(t, err)
	if recheck {
		require.NoError(t, f.ch.CommitBlocks(ctx, 1))
		done, err := finality.NewRechecker(gate, f.db).Recheck(ctx, first, "ops")
		require.NoError(t, err)
		require.Equal(t, postgres.RecheckReopened, done.Result, done.Detail)
	} else {
		again := report(mined, "1")
		back, err := f.db.ReturnDeposit(ctx, "", payment.Transfer{Network: payment.DefaultNetwork, TxHash: mined.Hash, Index: "1"}, true, "reported again")
		require.NoError(t, err)
		require.Equal(t, postgres.WatchedAgain, back, "found by its transaction, not the old log index")
		require.NoError(t, f.ch.CommitBlocks(ctx, 1))
		result := apply(again)
		require.Equal(t, payment.OutcomeDuplicateTransfer, result.Outcome, "the first deposit's claim moved to log 1")
	}
	var state string
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT chain_state FROM payment_events WHERE event_id = $1`, first).Scan(&state))
	require.Equal(t, "watching", state)
	require.NoError(t, f.ch.FinalizeThrough(ctx, mined.BlockNumber))
	require.NoError(t, gate.WatchReorgs(ctx))
	require.NoError(t, gate.WatchReorgs(ctx))
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.NewFromInt(5).Equal(balance()), "credited once: credit, compensation, give-back; balance %s", balance())
	testenv.RequireInvariants(t, f.db)
}

// tokenChain is a dev chain with a token TOK (6 decimals) listed, a gate
// under one confirmation, and another transfer already mined.
type tokenChain struct {
	*timeoutFixture
	gate  *finality.Gate
	token string
}

func newTokenChain(t *testing.T) *tokenChain {
	f := newTimeoutFixture(t)
	ctx := f.ctx
	token, _, err := f.ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	_, err = f.db.AddAsset(ctx, payment.Asset{Code: "TOK", Network: payment.DefaultNetwork, Contract: token, Decimals: 6})
	require.NoError(t, err)
	assets, err := f.db.Assets(ctx)
	require.NoError(t, err)
	policy, err := chain.ConfirmationsPolicy(1)
	require.NoError(t, err)
	checker := chain.NewChecker(f.client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork})
	gate := finality.New(finality.Options{
		Store: f.db, Chain: checker, Assets: assets, Policy: policy,
		Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		ReorgRecheckDelay: 30 * time.Second, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	other := f.ch.Accounts()[2].Address
	_, err = f.ch.TransferToken(ctx, 0, token, other, big.NewInt(100_000_000))
	require.NoError(t, err)
	return &tokenChain{timeoutFixture: f, gate: gate, token: token}
}

// balance is user 1's TOK.
func (tc *tokenChain) balance() decimal.Decimal {
	var text string
	require.NoError(tc.t, tc.conn.QueryRow(tc.ctx, `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'TOK'), '0')`).Scan(&text))
	return decimal.RequireFromString(text)
}

// apply runs one stored event through the gate and the ledger.
func (tc *tokenChain) apply(id string) postgres.LedgerResult {
	t := tc.t
	var claimed []postgres.Claimed
	var err error
	for range 100 {
		claimed, err = tc.db.ClaimOutbox(tc.ctx, 10, 10, postgres.TaskEventsMax)
		require.NoError(t, err)
		if len(claimed) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Len(t, claimed, 1)
	require.Equal(t, id, claimed[0].Event.ID)
	item, err := tc.gate.Check(tc.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(t, err)
	require.NotNil(t, item, "one confirmation: decided")
	results, err := tc.db.ApplyBatch(tc.ctx, []postgres.LedgerItem{*item}, postgres.LedgerOptions{})
	require.NoError(t, err)
	return results[0]
}

// report stores a provider's 5 TOK deposit of tx's log at index.
func (tc *tokenChain) report(tx devchain.Tx, index string) string {
	tr := payment.Transfer{Network: payment.DefaultNetwork, TxHash: tx.Hash, Index: index}
	e := payment.Event{ID: tr.EventID(), Type: payment.Deposit, UserID: 1, Asset: "TOK", Amount: decimal.RequireFromString("5"),
		TxHash: tx.Hash, TransferIndex: index, TraceID: "trace-" + index, Network: payment.DefaultNetwork}
	inserted, err := tc.db.InsertEvent(tc.ctx, postgres.NewEvent{Event: e, Source: postgres.SourceAlchemy, ToAddress: tc.to})
	require.NoError(tc.t, err)
	require.True(tc.t, inserted)
	return e.ID
}
