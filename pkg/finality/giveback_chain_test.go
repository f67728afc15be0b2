package finality_test

import (
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
