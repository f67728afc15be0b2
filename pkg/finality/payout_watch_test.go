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

// payoutChain is a dev chain over JSON-RPC with user 1 holding 10 ETH, a
// hold "h1" of 1 ETH to the fixture's address, and its post "p1" settled
// at one confirmation with a transaction paying it.
type payoutChain struct {
	*timeoutFixture
	gate   *finality.Gate
	alerts *alerts
	reg    *prometheus.Registry
	tx     devchain.Tx
}

func newPayoutChain(t *testing.T) *payoutChain {
	f := newTimeoutFixture(t)
	assets, err := f.db.Assets(f.ctx)
	require.NoError(t, err)
	policy, err := chain.ConfirmationsPolicy(1)
	require.NoError(t, err)
	checker := chain.NewChecker(f.client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork})
	p := &payoutChain{timeoutFixture: f, alerts: &alerts{}, reg: prometheus.NewRegistry()}
	p.gate = finality.New(finality.Options{
		Store: f.db, Chain: checker, Assets: assets, Policy: policy,
		Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		ReorgRecheckDelay: 30 * time.Second, Alerts: p.alerts, Log: zerolog.Nop(), Registerer: p.reg,
	})
	_, err = f.conn.Exec(f.ctx, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (1, 'ETH', 10, 10)
		ON CONFLICT (user_id, asset) DO UPDATE SET balance = 10, initial_balance = 10`)
	require.NoError(t, err)
	p.insert(payment.Event{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH", Amount: decimal.NewFromInt(1),
		Network: payment.DefaultNetwork, ToAddress: f.to, TraceID: "trace-h1"})
	testenv.SettleOutbox(t, f.db) // the hold has no transaction: no gate

	p.tx, err = f.ch.SendETH(f.ctx, 0, f.to, big.NewInt(1e18))
	require.NoError(t, err)
	p.insert(payment.Event{ID: "p1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: decimal.NewFromInt(1),
		HoldID: "h1", TxHash: p.tx.Hash, Network: payment.DefaultNetwork, ToAddress: f.to, TraceID: "trace-p1"})
	require.NoError(t, f.ch.CommitBlocks(f.ctx, 2))
	claimed, err := f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	item, err := p.gate.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
	require.NoError(t, err)
	require.NotNil(t, item, "one confirmation: the post settles")
	_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*item}, postgres.LedgerOptions{})
	require.NoError(t, err)
	p.requireSettled()
	return p
}

func (p *payoutChain) insert(e payment.Event) {
	p.t.Helper()
	inserted, err := p.db.InsertEvent(p.ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments, ToAddress: e.ToAddress})
	require.NoError(p.t, err)
	require.True(p.t, inserted)
}

// post reads what the post's row says of its chain evidence.
func (p *payoutChain) post() (chainState, reason string) {
	p.t.Helper()
	require.NoError(p.t, p.conn.QueryRow(p.ctx, `SELECT COALESCE(chain_state, ''), COALESCE(error, '') FROM payment_events WHERE event_id = 'p1'`).Scan(&chainState, &reason))
	return chainState, reason
}

// requireSettled: the post's money effects, whatever the chain did since.
func (p *payoutChain) requireSettled() {
	t := p.t
	t.Helper()
	var status, outcome, balance, held, hold string
	require.NoError(t, p.conn.QueryRow(p.ctx, `SELECT status, outcome FROM payment_events WHERE event_id = 'p1'`).Scan(&status, &outcome))
	require.Equal(t, []string{"confirmed", "success"}, []string{status, outcome})
	require.NoError(t, p.conn.QueryRow(p.ctx, `SELECT balance::numeric(38,0)::text, held::numeric(38,0)::text FROM balances WHERE user_id = 1 AND asset = 'ETH'`).Scan(&balance, &held))
	require.Equal(t, []string{"9", "0"}, []string{balance, held}, "debited once, nothing held")
	require.NoError(t, p.conn.QueryRow(p.ctx, `SELECT status FROM holds WHERE hold_id = 'h1'`).Scan(&hold))
	require.Equal(t, "posted", hold)
	var others int
	require.NoError(t, p.conn.QueryRow(p.ctx, `SELECT count(*) FROM payment_events WHERE event_id NOT IN ('h1', 'p1')`).Scan(&others))
	require.Zero(t, others, "no compensation or other event")
}

func (p *payoutChain) reorgedCount() float64 {
	p.t.Helper()
	families, err := p.reg.Gather()
	require.NoError(p.t, err)
	for _, f := range families {
		if f.GetName() != "settle_payout_reorged_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == payment.DefaultNetwork {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1 // not exported
}

// TestPayoutReorgedIsReported, on a real dev chain over JSON-RPC: a post
// settled at one confirmation stays watched, and when a reorg drops its
// payout transaction the watch records why on the post, counts it and
// raises a critical alert, once. No money moves: the user stays debited
// and the hold posted, for an operator to decide.
func TestPayoutReorgedIsReported(t *testing.T) {
	p := newPayoutChain(t)
	state, _ := p.post()
	require.Equal(t, "watching", state, "confirmed under confirmations:1: watched until final")
	require.NoError(t, p.gate.WatchReorgs(p.ctx))
	state, _ = p.post()
	require.Equal(t, "watching", state, "canonical, not final")
	require.Zero(t, p.reorgedCount())

	_, err := p.ch.Reorg(p.ctx, p.tx.Hash)
	require.NoError(t, err)
	for range 3 { // a null after a fork is read once more first
		require.NoError(t, p.gate.WatchReorgs(p.ctx))
		if state, _ = p.post(); state != "watching" {
			break
		}
	}
	state, reason := p.post()
	require.Equal(t, "reorged", state)
	require.Contains(t, reason, p.tx.Hash)
	require.Contains(t, reason, "left the canonical chain")
	require.Equal(t, float64(1), p.reorgedCount())
	require.Equal(t, []string{"payout_reorged:p1"}, p.alerts.raised())
	p.requireSettled()

	require.NoError(t, p.gate.WatchReorgs(p.ctx))
	require.Equal(t, float64(1), p.reorgedCount(), "reported once")
	require.Len(t, p.alerts.raised(), 1)
	p.requireSettled()
	testenv.RequireInvariants(t, p.db)
}

// TestPayoutFinalIntactIsUnwatched: once the payout's block is finalized
// with it intact, the post stops being watched, with nothing reported.
func TestPayoutFinalIntactIsUnwatched(t *testing.T) {
	p := newPayoutChain(t)
	require.NoError(t, p.ch.FinalizeThrough(p.ctx, p.tx.BlockNumber))
	require.NoError(t, p.gate.WatchReorgs(p.ctx))
	state, reason := p.post()
	require.Equal(t, "final", state)
	require.Empty(t, reason)
	require.Zero(t, p.reorgedCount())
	require.Empty(t, p.alerts.raised())
	p.requireSettled()
	testenv.RequireInvariants(t, p.db)
}
