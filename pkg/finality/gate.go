// Package finality is the gate between a deposit with a transaction and
// the ledger: it credits only what the chain's finality policy allows,
// parks what must wait (without burning retries), decides what the chain
// refuses, and follows deposits credited before finality until they are
// final or reorged away.
package finality

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Defaults and bounds.
const (
	TimeoutDefault      = time.Hour
	RecheckFirstDefault = 2 * time.Second
	RecheckMaxDefault   = time.Minute
	// WatchBatchMax bounds one reorg-watch pass.
	WatchBatchMax = 500
)

// Store is the database side of the gate.
type Store interface {
	ChainWait(ctx context.Context, eventID string) (postgres.ChainWaitState, error)
	AwaitFinality(ctx context.Context, e payment.Event, w postgres.Wait) (bool, error)
	DecideChainOutcome(ctx context.Context, e payment.Event, outcome payment.Outcome, reason string) (bool, error)
	UserDepositAddresses(ctx context.Context, network string, user int64) ([]string, error)
	WatchedDeposits(ctx context.Context, limit int) ([]postgres.WatchedDeposit, error)
	MarkFinal(ctx context.Context, eventID string) error
	TouchWatched(ctx context.Context, eventID string) error
	ReverseDeposit(ctx context.Context, eventID, reason, traceID string) (postgres.Reversal, error)
}

// Chain is what the gate asks the chain.
type Chain interface {
	CheckDeposit(ctx context.Context, d chain.Deposit, p chain.Policy) (chain.Verdict, error)
	StillCanonical(ctx context.Context, txHash string, blockNumber uint64, blockHash string) (chain.CanonicalState, error)
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// Options configure a Gate.
type Options struct {
	Store        Store
	Chain        Chain
	Assets       *payment.Registry
	Policy       chain.Policy
	Timeout      time.Duration // FINALITY_TIMEOUT
	RecheckFirst time.Duration
	RecheckMax   time.Duration
	Alerts       Alerter
	Log          zerolog.Logger
	Registerer   prometheus.Registerer
	// Now is the worker's clock. No stored schedule and no comparison with
	// a database time uses it: those take the database's now().
	Now func() time.Time
}

// Gate implements queue.Gate.
type Gate struct {
	o        Options
	verdicts *prometheus.CounterVec
	watched  *prometheus.CounterVec
}

// New builds a gate.
func New(o Options) *Gate {
	if o.Timeout <= 0 {
		o.Timeout = TimeoutDefault
	}
	if o.RecheckFirst <= 0 {
		o.RecheckFirst = RecheckFirstDefault
	}
	if o.RecheckMax <= 0 {
		o.RecheckMax = RecheckMaxDefault
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Gate{
		o: o,
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_finality_checks_total", Help: "Finality checks of deposits by verdict (credit, wait, reverted, mismatch, unavailable, reorged, not_found).",
		}, []string{"verdict"}),
		watched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_reorg_watch_total", Help: "Credited deposits examined by the reorg watcher, by state (final, canonical, gone).",
		}, []string{"state"}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.verdicts, g.watched)
	}
	return g
}

// Check decides one deposit: the item to credit (with its chain evidence),
// or nil when the deposit was parked or decided here.
func (g *Gate) Check(ctx context.Context, item postgres.LedgerItem) (*postgres.LedgerItem, error) {
	e := item.Event
	log := logging.From(ctx)
	state, err := g.o.Store.ChainWait(ctx, e.ID)
	if err != nil {
		return nil, err
	}
	deposit, network, err := g.deposit(ctx, e, state.ToAddress)
	if err != nil {
		return nil, err
	}
	verdict, err := g.o.Chain.CheckDeposit(ctx, deposit, g.o.Policy)
	if errors.Is(err, payment.ErrUnavailable) {
		// The chain cannot be asked: wait, and do not count this against
		// the finality timeout's outcome (it is decided on an answer).
		g.verdicts.WithLabelValues("unavailable").Inc()
		log.Warn().Err(err).Msg("chain unavailable; deposit waits")
		// The usual schedule: while the breaker is open a check fails fast
		// without touching the node, so asking again costs nothing.
		return nil, g.park(ctx, e, state, postgres.Wait{RecheckIn: g.recheckAfter(state.Checks), Note: "chain unavailable: " + err.Error()})
	}
	if err != nil {
		return nil, err
	}
	g.verdicts.WithLabelValues(string(verdict.State)).Inc()
	switch verdict.State {
	case chain.Credit:
		watch := !verdict.Finalized
		log.Info().Str("network", network).Uint64("block", verdict.BlockNumber).Bool("final", verdict.Finalized).Msg("deposit passes the finality policy")
		item.Chain = &postgres.ChainEvidence{BlockNumber: int64(verdict.BlockNumber), BlockHash: verdict.BlockHash, Watch: watch}
		return &item, nil
	case chain.Reverted:
		return nil, g.decide(ctx, e, payment.OutcomeReverted, verdict.Reason, false)
	case chain.Mismatch:
		return nil, g.decide(ctx, e, payment.OutcomeMismatch, verdict.Reason, true)
	case chain.Wait:
		if state.Age >= g.o.Timeout {
			switch {
			case !verdict.ReceiptSeen && state.ReceiptSeen:
				g.verdicts.WithLabelValues("reorged").Inc()
				return nil, g.decide(ctx, e, payment.OutcomeReorged, "receipt seen, then gone; not back within "+g.o.Timeout.String(), true)
			case !verdict.ReceiptSeen:
				g.verdicts.WithLabelValues("not_found").Inc()
				return nil, g.decide(ctx, e, payment.OutcomeNotFound, "transaction not found within "+g.o.Timeout.String(), true)
			default:
				// Mined and still canonical, only slow to finalize: a real
				// deposit is never failed for the chain's slowness.
				g.o.Alerts.Raise("finality_stalled", alert.Warning, "deposits mined but not final past FINALITY_TIMEOUT", map[string]any{
					"event_id": e.ID, "trace_id": e.TraceID, "tx_hash": e.TxHash,
				})
			}
		}
		if state.ReceiptSeen && !verdict.ReceiptSeen {
			log.Warn().Msg("receipt seen before is gone: the transaction left the canonical chain")
		}
		wait := postgres.Wait{
			RecheckIn:   g.recheckAfter(state.Checks),
			ReceiptSeen: verdict.ReceiptSeen,
			BlockNumber: int64(verdict.BlockNumber),
			BlockHash:   verdict.BlockHash,
			Note:        verdict.Reason,
		}
		return nil, g.park(ctx, e, state, wait)
	}
	return nil, fmt.Errorf("chain returned unknown verdict %q", verdict.State)
}

// deposit describes the event as the chain should confirm it.
func (g *Gate) deposit(ctx context.Context, e payment.Event, toAddress string) (chain.Deposit, string, error) {
	asset, ok := g.o.Assets.ByCode(e.Asset)
	if !ok {
		return chain.Deposit{}, "", payment.Invalid("asset %s is not in the registry", e.Asset)
	}
	units, ok := money.ToBaseUnits(e.Amount, asset.Decimals)
	if !ok {
		return chain.Deposit{}, "", payment.Invalid("amount %s has more digits than %s's %d decimals", e.Amount, asset.Code, asset.Decimals)
	}
	d := chain.Deposit{TxHash: e.TxHash, Token: asset.Contract, Amount: units}
	if asset.Native() && alchemy.InternalTransfer(e.ID) {
		d.Internal = true
		return d, asset.Network, nil
	}
	if toAddress != "" {
		d.Recipients = []string{toAddress}
		return d, asset.Network, nil
	}
	// A deposit named by user only: the Transfer (or the transaction's
	// value) must go to one of the user's registered addresses on the
	// asset's network.
	addresses, err := g.o.Store.UserDepositAddresses(ctx, asset.Network, e.UserID)
	if err != nil {
		return chain.Deposit{}, "", err
	}
	if len(addresses) > chain.RecipientsMax {
		addresses = addresses[:chain.RecipientsMax]
	}
	d.Recipients = addresses
	return d, asset.Network, nil
}

// recheckAfter grows from RecheckFirst to RecheckMax with each check.
func (g *Gate) recheckAfter(checks int) time.Duration {
	d := g.o.RecheckFirst
	for i := 0; i < checks && d < g.o.RecheckMax; i++ {
		d *= 2
	}
	return min(d, g.o.RecheckMax)
}

func (g *Gate) park(ctx context.Context, e payment.Event, state postgres.ChainWaitState, w postgres.Wait) error {
	w.ReceiptSeen = w.ReceiptSeen || state.ReceiptSeen
	moved, err := g.o.Store.AwaitFinality(ctx, e, w)
	if err != nil {
		return err
	}
	if moved {
		logging.From(ctx).Debug().Dur("recheck_in", w.RecheckIn).Str("why", w.Note).Msg("deposit awaits finality")
	}
	return nil
}

func (g *Gate) decide(ctx context.Context, e payment.Event, outcome payment.Outcome, reason string, raise bool) error {
	moved, err := g.o.Store.DecideChainOutcome(ctx, e, outcome, reason)
	if err != nil || !moved {
		return err
	}
	logging.From(ctx).Warn().Str("outcome", string(outcome)).Str("reason", reason).Msg("deposit refused by the chain")
	if raise {
		g.o.Alerts.Raise("deposit_"+string(outcome), alert.Warning, "deposit refused by the chain: "+string(outcome), map[string]any{
			"event_id": e.ID, "trace_id": e.TraceID, "tx_hash": e.TxHash, "reason": reason,
		})
	}
	return nil
}

// WatchReorgs follows credited, not yet final deposits: final ones stop
// being watched; ones whose transaction left the canonical chain get their
// compensation event (once, however often the reorg is seen).
func (g *Gate) WatchReorgs(ctx context.Context) error {
	watched, err := g.o.Store.WatchedDeposits(ctx, WatchBatchMax)
	if err != nil {
		return err
	}
	for _, w := range watched {
		state, err := g.o.Chain.StillCanonical(ctx, w.TxHash, uint64(w.BlockNumber), w.BlockHash)
		if err != nil {
			return fmt.Errorf("reorg watch of %s: %w", w.EventID, err)
		}
		g.watched.WithLabelValues(string(state)).Inc()
		switch state {
		case chain.Final:
			err = g.o.Store.MarkFinal(ctx, w.EventID)
		case chain.Canonical:
			err = g.o.Store.TouchWatched(ctx, w.EventID)
		case chain.Gone:
			var r postgres.Reversal
			r, err = g.o.Store.ReverseDeposit(ctx, w.EventID, fmt.Sprintf("transaction %s left the canonical chain (block %d %s)", w.TxHash, w.BlockNumber, w.BlockHash), w.TraceID)
			if err == nil {
				g.o.Log.Warn().Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).Str("reversal", r.String()).
					Msg("credited deposit reorged away")
				g.o.Alerts.Raise("deposit_reorged:"+w.EventID, alert.Critical, "credited deposit left the canonical chain; compensating", map[string]any{
					"event_id": w.EventID, "trace_id": w.TraceID, "tx_hash": w.TxHash, "reversal": r.String(),
				})
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
