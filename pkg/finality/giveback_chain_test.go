package finality_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestDroppedThenMinedAgainIsGivenBack, on a real dev chain over JSON-RPC:
// a deposit credited at one confirmation is dropped by a reorg and
// compensated; its very transaction is mined again a few blocks later and
// reported again. It is watched again and given back only once its new
// block is finalized: the user ends with the deposit credited once.
func TestDroppedThenMinedAgainIsGivenBack(t *testing.T) {
	f := newTimeoutFixture(t)
	assets, err := f.db.Assets(f.ctx)
	require.NoError(t, err)
	policy, err := chain.ConfirmationsPolicy(1)
	require.NoError(t, err)
	checker := chain.NewChecker(f.client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork})
	gate := finality.New(finality.Options{
		Store: f.db, Chain: checker, Assets: assets, Policy: policy,
		Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		ReorgRecheckDelay: 30 * time.Second, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
	balance := func() decimal.Decimal {
		t.Helper()
		var text string
		require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'ETH'), '0')`).Scan(&text))
		return decimal.RequireFromString(text)
	}
	chainState := func() string {
		t.Helper()
		var s string
		require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT COALESCE(chain_state, '') FROM payment_events WHERE event_id = 'again'`).Scan(&s))
		return s
	}
	exists := func(id string) bool {
		t.Helper()
		var n int
		require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
		return n == 1
	}

	tx := f.deposit("again", 0)
	require.NoError(t, f.ch.CommitBlocks(f.ctx, 2))
	claimed, err := f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	credit, err := gate.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(t, err)
	require.NotNil(t, credit, "one confirmation: credited")
	_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credit}, postgres.LedgerOptions{})
	require.NoError(t, err)
	require.Equal(t, "watching", chainState())
	require.True(t, decimal.NewFromInt(1).Equal(balance()))

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

	require.NoError(t, f.ch.FinalizeThrough(f.ctx, mined.BlockNumber))
	require.NoError(t, gate.WatchReorgs(f.ctx))
	require.Equal(t, "final", chainState())
	require.True(t, exists(payment.ReturnEventID(1, "again")))
	require.NoError(t, gate.WatchReorgs(f.ctx))
	testenv.SettleOutbox(t, f.db)
	require.True(t, decimal.NewFromInt(1).Equal(balance()), "credited once: credit, compensation, give-back")
	testenv.RequireInvariants(t, f.db)
}
