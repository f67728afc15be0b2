//go:build !fuzzing

package finality_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

// internalFixture is the worker's gate under the policy none over a dev
// chain with the forwarder (ETH moved by contract call) and real
// PostgreSQL: every internal deposit is decided on its first check.
type internalFixture struct {
	t         *testing.T
	ctx       context.Context
	ch        *devchain.Chain
	db        *postgres.DB
	conn      *pgx.Conn
	gate      *finality.Gate
	alerts    *alerts
	reg       *prometheus.Registry
	forwarder string
	to        string // account 1, user 1's deposit address
}

func newInternalFixture(t *testing.T, noTraces bool) *internalFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: noTraces})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	client, err := chain.Dial(ctx, ch.URL(), chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	to := ch.Accounts()[1].Address
	_, err = db.AddDepositAddress(ctx, payment.DefaultNetwork, to, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)
	forwarder, _, err := ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	f := &internalFixture{t: t, ctx: ctx, ch: ch, db: db, conn: conn, alerts: &alerts{}, reg: prometheus.NewRegistry(), forwarder: forwarder, to: to}
	f.gate = finality.New(finality.Options{
		Store: db, Chain: chain.NewChecker(client, chain.CheckerOptions{Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork}),
		Assets: assets, Policy: chain.NonePolicy(), Timeout: time.Hour, RecheckFirst: time.Millisecond, RecheckMax: time.Millisecond,
		Alerts: f.alerts, Log: zerolog.Nop(), Registerer: f.reg,
	})
	return f
}

// forward sends eth ETH through the forwarder to to, as how says.
func (f *internalFixture) forward(to string, eth string, how devchain.Forward) devchain.Tx {
	f.t.Helper()
	wei := decimal.RequireFromString(eth).Shift(18).BigInt()
	tx, err := f.ch.SendForward(f.ctx, 0, f.forwarder, to, wei, how)
	require.NoError(f.t, err)
	require.Equal(f.t, uint64(1), tx.Status)
	return tx
}

// report stores the internal deposit a provider reports: amount eth to
// toAddress ("" names none) by the frame at index.
func (f *internalFixture) report(id string, tx devchain.Tx, index, eth, toAddress string) {
	f.t.Helper()
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString(eth),
		TxHash: tx.Hash, TraceID: "trace-" + id, Network: payment.DefaultNetwork, TransferIndex: index}
	inserted, err := f.db.InsertEvent(f.ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments, ToAddress: toAddress})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
}

// checkAll claims the stored deposits and runs the gate on each: the
// ones it hands to the ledger, by event id.
func (f *internalFixture) checkAll(n int) map[string]*postgres.LedgerItem {
	f.t.Helper()
	credits := map[string]*postgres.LedgerItem{}
	for seen := 0; seen < n; {
		claimed, err := f.db.ClaimOutbox(f.ctx, 100, 100, postgres.TaskEventsMax)
		require.NoError(f.t, err)
		for _, c := range claimed {
			credit, err := f.gate.Check(f.ctx, postgres.LedgerItem{Event: c.Event})
			require.NoError(f.t, err)
			if credit != nil {
				credits[c.Event.ID] = credit
			}
			seen++
		}
		if len(claimed) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return credits
}

func (f *internalFixture) state(id string) (string, string) {
	f.t.Helper()
	var status, outcome, reason string
	require.NoError(f.t, f.conn.QueryRow(f.ctx, `SELECT status, COALESCE(outcome, ''), COALESCE(error, '') FROM payment_events WHERE event_id = $1`, id).
		Scan(&status, &outcome, &reason))
	return status + "/" + outcome, reason
}

// TestInternalDepositsAgainstTheTrace: an internal deposit (trace:<a>) is
// credited only when the call its index names pays the deposit: a
// provider's report of another amount, recipient, a rolled-back call or a
// frame the trace does not have ends failed/mismatch saying what the chain
// shows, as a native deposit's would.
func TestInternalDepositsAgainstTheTrace(t *testing.T) {
	f := newInternalFixture(t, false)
	other := f.ch.Accounts()[2].Address
	direct := f.forward(f.to, "0.5", devchain.ForwardDirect)
	nested := f.forward(f.to, "0.25", devchain.ForwardNested)
	reverted := f.forward(f.to, "0.125", devchain.ForwardReverted)

	f.report("good", direct, "trace:call_0", "0.5", f.to)
	f.report("good-by-user", nested, "trace:call_0_0", "0.25", "")
	f.report("amount", direct, "trace:call_0", "5", f.to)
	f.report("recipient", nested, "trace:call_0_0", "0.25", other)
	f.report("reverted", reverted, "trace:call_0_0", "0.125", f.to)
	f.report("no-frame", direct, "trace:call_0_1", "0.5", f.to)
	credits := f.checkAll(6)

	require.Len(t, credits, 2)
	require.Contains(t, credits, "good")
	require.Contains(t, credits, "good-by-user")
	require.Equal(t, []string{"trace:call_0"}, credits["good"].Chain.Transfers)
	require.Equal(t, []string{"trace:call_0_0"}, credits["good-by-user"].Chain.Transfers)
	_, err := f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credits["good"], *credits["good-by-user"]}, postgres.LedgerOptions{})
	require.NoError(t, err)

	for id, want := range map[string]string{
		"amount":    "the call at call_0 carries 500000000000000000 base units, the deposit says 5000000000000000000",
		"recipient": "the call at call_0_0 pays " + f.to + ", not " + other,
		"reverted":  "the call at call_0_0 was rolled back (execution reverted): it moved nothing",
		"no-frame":  "the transaction's call trace has no frame call_0_1",
	} {
		status, reason := f.state(id)
		require.Equal(t, "failed/mismatch", status, id)
		require.Equal(t, want, reason, id)
	}
	for _, id := range []string{"good", "good-by-user"} {
		status, _ := f.state(id)
		require.Equal(t, "confirmed/success", status, id)
	}
	testenv.RequireInvariants(t, f.db)
}

// TestInternalDepositWithoutDebugAPI: on a node without the debug API an
// internal deposit is never credited unchecked: it waits in
// awaiting_finality saying why and what to do, counted as untraced and
// alerted, while a native deposit of the same network is credited.
func TestInternalDepositWithoutDebugAPI(t *testing.T) {
	f := newInternalFixture(t, true)
	direct := f.forward(f.to, "0.5", devchain.ForwardDirect)
	native, err := f.ch.SendETH(f.ctx, 0, f.to, big.NewInt(1e18))
	require.NoError(t, err)
	f.report("internal", direct, "trace:call_0", "0.5", f.to)
	f.report("native", native, "", "1", f.to)
	credits := f.checkAll(2)
	require.Len(t, credits, 1)
	require.NotNil(t, credits["native"], "the breaker stayed shut: the node answered")

	status, note := f.state("internal")
	require.Equal(t, "awaiting_finality/", status)
	require.Contains(t, note, "does not serve debug_traceTransaction")
	require.Contains(t, note, "INTERNAL_TRANSFER_CHECK_ETH_MAINNET=status")
	require.Contains(t, f.alerts.raised(), "internal_deposit_untraced:ETH_MAINNET")
	require.Equal(t, map[string]float64{"credit": 1, "untraced": 1}, f.verdicts())
	// SettleInternalDepositsUntraced holds from this time to the next check.
	require.Positive(t, f.gauge("settle_finality_untraced_timestamp_seconds", "stage")["check"])
	require.Equal(t, time.Millisecond.Seconds(), f.gauge("settle_finality_recheck_max_seconds", "")[""], "the fixture's RecheckMax")
}

// verdicts reads settle_finality_checks_total by verdict.
func (f *internalFixture) verdicts() map[string]float64 {
	return f.counter("settle_finality_checks_total", "verdict")
}

// gauge reads the gate's gauge name by its label ("" for none).
func (f *internalFixture) gauge(name, label string) map[string]float64 {
	return f.metric(name, label, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

// counter reads the gate's counter name summed by its label.
func (f *internalFixture) counter(name, label string) map[string]float64 {
	return f.metric(name, label, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// metric sums value over the series of name by their label.
func (f *internalFixture) metric(name, label string, value func(*dto.Metric) float64) map[string]float64 {
	f.t.Helper()
	families, err := f.reg.Gather()
	require.NoError(f.t, err)
	out := map[string]float64{}
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
		for _, m := range family.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					key = l.GetValue()
				}
			}
			out[key] += value(m)
		}
	}
	return out
}

// TestWatchedInternalDepositWithoutDebugAPI: a credited internal deposit
// whose transaction a reorg mined again in another block cannot be held
// against its trace on a node without the debug API. That deposit goes
// to the back of the watch, still credited and watched at its old block,
// while the network's other deposits are still watched in the same pass
// (the node's answer is not an outage: it gives it every time).
func TestWatchedInternalDepositWithoutDebugAPI(t *testing.T) {
	f := newInternalFixture(t, true)
	native, err := f.ch.SendETH(f.ctx, 0, f.to, big.NewInt(1e18))
	require.NoError(t, err)
	direct := f.forward(f.to, "0.5", devchain.ForwardDirect)

	// Credited while the operator took the provider's word (status), the
	// internal one first, so that the watch reads it first.
	client, err := chain.Dial(f.ctx, f.ch.URL(), chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	assets, err := f.db.Assets(f.ctx)
	require.NoError(t, err)
	statusOnly := finality.New(finality.Options{
		Store: f.db, Assets: assets, Policy: chain.NonePolicy(), Alerts: f.alerts, Log: zerolog.Nop(),
		Chain: chain.NewChecker(client, chain.CheckerOptions{
			Registerer: prometheus.NewRegistry(), NotFinalTTL: -1, Network: payment.DefaultNetwork, InternalStatusOnly: true,
		}),
	})
	credit := func(id string) {
		t.Helper()
		claimed, err := f.db.ClaimOutbox(f.ctx, 10, 10, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		item, err := statusOnly.Check(f.ctx, postgres.LedgerItem{Event: claimed[0].Event})
		require.NoError(t, err)
		require.NotNil(t, item, id)
		require.True(t, item.Chain.Watch, id)
		_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*item}, postgres.LedgerOptions{})
		require.NoError(t, err)
	}
	f.report("internal", direct, "trace:call_0", "0.5", f.to)
	credit("internal")
	f.report("native", native, "", "1", f.to)
	credit("native")

	_, raw, err := f.ch.Drop(f.ctx, direct.Hash)
	require.NoError(t, err)
	again, err := f.ch.Resend(f.ctx, raw)
	require.NoError(t, err)
	require.NotEqual(t, direct.BlockHash, again.BlockHash)
	require.NoError(t, f.ch.FinalizeThrough(f.ctx, native.BlockNumber))

	err = f.gate.WatchReorgs(f.ctx)
	require.ErrorIs(t, err, chain.ErrTxTraceUnsupported, "the pass says one deposit went unchecked")
	require.Equal(t, "final", f.chainState("native"), "the network's other deposits are still watched")
	require.Equal(t, "watching", f.chainState("internal"))
	var block int64
	require.NoError(t, f.conn.QueryRow(f.ctx, `SELECT block_number FROM payment_events WHERE event_id = 'internal'`).Scan(&block))
	require.EqualValues(t, direct.BlockNumber, block, "no evidence moved on an unchecked transfer")
	require.Equal(t, 1.0, f.counter("settle_reorg_watch_total", "state")["untraced"])
	require.Positive(t, f.gauge("settle_finality_untraced_timestamp_seconds", "stage")["watch"])

	// Every pass alike: it waits for a node with the debug API, still credited.
	require.ErrorIs(t, f.gate.WatchReorgs(f.ctx), chain.ErrTxTraceUnsupported)
	require.Equal(t, "watching", f.chainState("internal"))
	testenv.SettleOutbox(t, f.db)
	testenv.RequireInvariants(t, f.db)
}

func (f *internalFixture) chainState(id string) string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.conn.QueryRow(f.ctx, `SELECT COALESCE(chain_state, '') FROM payment_events WHERE event_id = $1`, id).Scan(&s))
	return s
}

// TestPaymentsDepositPaidByACall: a /webhook/payments ETH deposit naming
// no transfer, sent from a contract wallet (the value goes to the wallet,
// a call inside pays the user), is credited claiming that call's frame;
// a provider's report of the same frame is then a duplicate_transfer.
func TestPaymentsDepositPaidByACall(t *testing.T) {
	f := newInternalFixture(t, false)
	sent := f.forward(f.to, "0.5", devchain.ForwardDirect)
	f.report("payments", sent, "", "0.5", "")
	credits := f.checkAll(1)
	require.Contains(t, credits, "payments")
	require.Equal(t, []string{"trace:call_0"}, credits["payments"].Chain.Transfers)
	_, err := f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credits["payments"]}, postgres.LedgerOptions{})
	require.NoError(t, err)

	f.report("provider", sent, "trace:call_0", "0.5", f.to)
	credits = f.checkAll(1)
	require.Contains(t, credits, "provider")
	_, err = f.db.ApplyBatch(f.ctx, []postgres.LedgerItem{*credits["provider"]}, postgres.LedgerOptions{})
	require.NoError(t, err)
	for id, want := range map[string]string{"payments": "confirmed/success", "provider": "failed/duplicate_transfer"} {
		status, _ := f.state(id)
		require.Equal(t, want, status, id)
	}
	testenv.RequireInvariants(t, f.db)
}
