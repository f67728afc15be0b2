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
	"maps"
	"math/big"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/tracing"
)

// Defaults and bounds.
const (
	TimeoutDefault      = time.Hour
	RecheckFirstDefault = 2 * time.Second
	RecheckMaxDefault   = time.Minute
	// WatchBatchMax bounds one reorg-watch pass, shared equally by the
	// networks the worker asks.
	WatchBatchMax = 500
	// ReorgRecheckDelayDefault: two reads of a missing receipt this far
	// apart (and a block apart) are evidence of a reorg.
	ReorgRecheckDelayDefault = 30 * time.Second
)

// Store is the database side of the gate.
type Store interface {
	ChainWait(ctx context.Context, eventID string) (postgres.ChainWaitState, error)
	AwaitFinality(ctx context.Context, e payment.Event, w postgres.Wait) (bool, error)
	DecideChainOutcome(ctx context.Context, e payment.Event, outcome payment.Outcome, reason string) (bool, error)
	DepositAddressOwners(ctx context.Context, network string, addresses []string) (map[string]int64, error)
	UserHasDepositAddress(ctx context.Context, network string, user int64) (bool, error)
	WatchedDeposits(ctx context.Context, networks []string, perNetwork int) ([]postgres.WatchedDeposit, error)
	MarkFinal(ctx context.Context, eventID string) (givenBack bool, err error)
	TouchWatched(ctx context.Context, eventID string) error
	KeepWatching(ctx context.Context, eventID string) error
	MoveEvidence(ctx context.Context, eventID, fromHash string, blockNumber int64, blockHash string, final bool) (moved, givenBack bool, err error)
	MarkPayoutReorged(ctx context.Context, eventID, fromHash, reason string) (bool, error)
	RecordAbsence(ctx context.Context, eventID, blockHash string, head int64, delay time.Duration) (postgres.Absence, error)
	RecordWaitAbsence(ctx context.Context, e payment.Event, blockHash string, head int64, delay time.Duration) (postgres.Absence, error)
	ReverseDeposit(ctx context.Context, eventID, reason, traceID string) (postgres.Reversal, error)
	ReturnDeposit(ctx context.Context, eventID string, t payment.Transfer, watch bool, reason string) (postgres.Return, error)
	ReopenDeposit(ctx context.Context, eventID string, outcomes []payment.Outcome, reason string) (bool, error)
}

// Chain is what the gate asks the chain.
type Chain interface {
	CheckDeposit(ctx context.Context, d chain.Deposit, p chain.Policy) (chain.Verdict, error)
	StillCanonical(ctx context.Context, d chain.Deposit, blockNumber uint64, blockHash string) (chain.Canonicity, error)
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// NetworkChain is one network's chain and its finality policy. Each has
// its own client, breaker and cache, so one network's outage parks only
// that network's deposits.
type NetworkChain struct {
	Chain  Chain
	Policy chain.Policy
}

// Options configure a Gate.
type Options struct {
	Store Store
	// Chain and Policy are ETH_MAINNET's when Networks is nil.
	Chain  Chain
	Policy chain.Policy
	// Networks are the networks asked, by name. Unchecked are enabled
	// networks without an RPC under the policy none: their deposits pass
	// unchecked, as they would without a gate. A deposit on any other
	// network waits (it should not have been accepted).
	Networks     map[string]NetworkChain
	Unchecked    map[string]bool
	Assets       *payment.Registry
	Timeout      time.Duration // FINALITY_TIMEOUT
	RecheckFirst time.Duration
	RecheckMax   time.Duration
	Alerts       Alerter
	Log          zerolog.Logger
	Registerer   prometheus.Registerer
	// ReorgRecheckDelay (REORG_RECHECK_DELAY): how far apart, on the
	// database's clock, two reads of a missing receipt must be.
	ReorgRecheckDelay time.Duration
	// Now is the worker's clock. No stored schedule and no comparison with
	// a database time uses it: those take the database's now().
	Now func() time.Time
}

// Gate implements worker.Gate.
type Gate struct {
	o        Options
	verdicts *prometheus.CounterVec
	watched  *prometheus.CounterVec
	payouts  *prometheus.CounterVec
	// untracedAt and recheckMax let SettleInternalDepositsUntraced hold
	// from one untraced count to the next when they are further apart
	// than its counters' window (FINALITY_RECHECK_MAX, REORG_WATCH_INTERVAL).
	untracedAt *prometheus.GaugeVec
	recheckMax prometheus.Gauge
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
	if o.ReorgRecheckDelay <= 0 {
		o.ReorgRecheckDelay = ReorgRecheckDelayDefault
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Networks == nil && o.Chain != nil {
		o.Networks = map[string]NetworkChain{payment.DefaultNetwork: {Chain: o.Chain, Policy: o.Policy}}
	}
	g := &Gate{
		o: o,
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_finality_checks_total", Help: "Finality checks of deposits by network and verdict (credit, wait, reverted, mismatch, unavailable, untraced, reorged, not_found).",
		}, []string{"network", "verdict"}),
		watched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_reorg_watch_total", Help: "Credited deposits and settled payouts examined by the reorg watcher, by network and what the chain showed (final, canonical, moved, absent, gone, error; untraced: an internal deposit mined again elsewhere, on a node without the debug API).",
		}, []string{"network", "state"}),
		untracedAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_finality_untraced_timestamp_seconds", Help: "When this worker last counted an untraced internal deposit, by network and stage (check: settle_finality_checks_total; watch: settle_reorg_watch_total).",
		}, []string{"network", "stage"}),
		recheckMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_finality_recheck_max_seconds", Help: "FINALITY_RECHECK_MAX: the longest wait between two finality checks of a waiting deposit.",
		}),
		payouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_payout_reorged_total", Help: "Settled withdrawal_posts whose payout transaction left the canonical chain after they confirmed, by network: the user stays debited and the payout may never land (SettlePayoutReorged).",
		}, []string{"network"}),
	}
	g.recheckMax.Set(o.RecheckMax.Seconds())
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.verdicts, g.watched, g.untracedAt, g.recheckMax, g.payouts)
	}
	// The untraced series of every network asked exist at 0 from the
	// start, so SettleInternalDepositsUntraced's increase() sees the
	// first one.
	for network := range o.Networks {
		g.verdicts.WithLabelValues(network, "untraced")
		g.watched.WithLabelValues(network, "untraced")
		g.payouts.WithLabelValues(network)
	}
	return g
}

// HasRPC tells whether the gate can ask a network's chain: it has an RPC
// there (RPC_URL_<NETWORK>). Each network has its own, so a provider's
// reorg report is evidence on one network and only a reason to ask on
// another.
func (g *Gate) HasRPC(network string) bool {
	_, ok := g.o.Networks[network]
	return ok
}

// Check decides one deposit: the item to credit (with its chain evidence),
// or nil when the deposit was parked or decided here.
func (g *Gate) Check(ctx context.Context, item postgres.LedgerItem) (*postgres.LedgerItem, error) {
	ctx, span := tracing.Start(ctx, "finality.check", tracing.Internal)
	defer span.End()
	e := item.Event
	if e.Network != "" && g.o.Unchecked[e.Network] {
		return &item, nil // policy none without an RPC: nothing to ask
	}
	log := logging.From(ctx)
	state, err := g.o.Store.ChainWait(ctx, e.ID)
	if err != nil {
		return nil, err
	}
	e.TransferIndex = state.TransferIndex
	if state.Network != "" {
		e.Network = state.Network
	}
	if g.o.Unchecked[networkOf(e)] {
		return &item, nil
	}
	if _, listed := g.o.Assets.Listing(networkOf(e), e.Asset); !listed && state.Age < g.o.Timeout {
		// The api took the event, so the listing exists: this worker has
		// not reread the registry since an operator added it (at most
		// REGISTRY_REFRESH ago). Wait for that instead of dead-lettering
		// the first deposits of a new asset.
		log.Info().Str("network", networkOf(e)).Str("asset", e.Asset).Msg("asset not in this worker's registry yet; deposit waits for its refresh")
		return nil, g.park(ctx, e, state, postgres.Wait{
			RecheckIn: g.recheckAfter(state.Checks),
			Note:      fmt.Sprintf("asset %s on %s is not in this worker's registry yet (REGISTRY_REFRESH)", e.Asset, networkOf(e)),
		})
	}
	// Past the timeout a never-seen deposit's null receipt may count
	// towards not_found, which needs the head it was read at.
	unseenLate := state.Age >= g.o.Timeout && !state.ReceiptSeen
	verdict, network, err := g.verdict(ctx, e, state.ToAddress, unseenLate)
	if errors.Is(err, chain.ErrTxTraceUnsupported) {
		// Never credited unchecked: it waits for a node with the debug
		// API, or for the operator to accept status-only checking.
		g.verdicts.WithLabelValues(networkOf(e), "untraced").Inc()
		g.untracedAt.WithLabelValues(networkOf(e), "check").Set(float64(g.o.Now().UnixNano()) / 1e9)
		note := fmt.Sprintf("%v; the deposit waits for an RPC with the debug API, or %s=status", err, InternalCheckSetting(networkOf(e)))
		log.Warn().Err(err).Msg("internal deposit cannot be checked without the debug API; deposit waits")
		g.o.Alerts.Raise("internal_deposit_untraced:"+networkOf(e), alert.Critical, "internal deposits wait: the network's RPC does not serve debug_traceTransaction", map[string]any{
			"network": networkOf(e), "event_id": e.ID, "trace_id": e.TraceID, "tx_hash": e.TxHash, "setting": InternalCheckSetting(networkOf(e)),
		})
		return nil, g.park(ctx, e, state, postgres.Wait{RecheckIn: g.recheckAfter(state.Checks), Note: note})
	}
	if errors.Is(err, payment.ErrUnavailable) {
		// The chain cannot be asked: wait, and do not count this against
		// the finality timeout's outcome (it is decided on an answer).
		g.verdicts.WithLabelValues(networkOf(e), "unavailable").Inc()
		log.Warn().Err(err).Msg("chain unavailable; deposit waits")
		if errors.Is(err, errNoRPCHere) {
			// A misconfiguration, not an outage: no breaker opens and no
			// timeout ends the wait, so only an operator can.
			g.o.Alerts.Raise("network_not_enabled:"+networkOf(e), alert.Critical, "events wait: their network is not enabled in this worker", map[string]any{
				"network": networkOf(e), "event_id": e.ID, "trace_id": e.TraceID, "settings": "NETWORKS, RPC_URL_" + networkOf(e),
			})
		}
		// The usual schedule: while the breaker is open a check fails fast
		// without touching the node, so asking again costs nothing.
		return nil, g.park(ctx, e, state, postgres.Wait{RecheckIn: g.recheckAfter(state.Checks), Note: "chain unavailable: " + err.Error()})
	}
	if err != nil {
		return nil, err
	}
	g.verdicts.WithLabelValues(networkOf(e), string(verdict.State)).Inc()
	switch verdict.State {
	case chain.Credit:
		watch := !verdict.Finalized
		log.Info().Str("network", network).Uint64("block", verdict.BlockNumber).Bool("final", verdict.Finalized).Msg("deposit passes the finality policy")
		item.Chain = &postgres.ChainEvidence{
			BlockNumber: int64(verdict.BlockNumber), BlockHash: verdict.BlockHash, Watch: watch, Transfers: verdict.Transfers,
			FirstLogIndex: int64(verdict.FirstLogIndex),
		}
		return &item, nil
	case chain.Reverted:
		return nil, g.decide(ctx, e, payment.OutcomeReverted, verdict.Reason, false)
	case chain.Mismatch:
		return nil, g.decide(ctx, e, payment.OutcomeMismatch, verdict.Reason, true)
	case chain.Wait:
		return nil, g.wait(ctx, e, state, verdict)
	}
	return nil, fmt.Errorf("chain returned unknown verdict %q", verdict.State)
}

// wait parks a deposit the chain cannot decide yet, or fails it when the
// chain shows its transaction is not there: seen and then gone
// (reorgEvidence) as soon as the chain shows it, a reversal before
// credit; never seen and absent on two reads (unseenEvidence) once
// FINALITY_TIMEOUT has passed. A reversed deposit's transaction mined
// again later reopens it when it is reported again (a provider, the
// scanner, a recheck).
func (g *Gate) wait(ctx context.Context, e payment.Event, state postgres.ChainWaitState, verdict chain.Verdict) error {
	if state.Age >= g.o.Timeout || (!verdict.ReceiptSeen && state.ReceiptSeen) {
		switch {
		case !verdict.ReceiptSeen && state.ReceiptSeen:
			ev, err := g.reorgEvidence(ctx, e, state)
			if errors.Is(err, payment.ErrUnavailable) {
				// An outage decides nothing: asked again on the schedule.
				verdict.Reason += "; chain unavailable for the reorg evidence: " + err.Error()
				break
			}
			if err != nil {
				return err
			}
			if ev.reorged != "" {
				g.verdicts.WithLabelValues(networkOf(e), "reorged").Inc()
				return g.decideUnseen(ctx, e, state, payment.OutcomeReorged, ev.reorged)
			}
			verdict.Reason += "; " + ev.seen.Reason
			if ev.found {
				// Only this read lagged: the receipt is where the chain says.
				verdict.ReceiptSeen, verdict.BlockNumber, verdict.BlockHash = true, ev.seen.BlockNumber, ev.seen.BlockHash
			}
		case !verdict.ReceiptSeen:
			notFound, err := g.unseenEvidence(ctx, e, verdict)
			if err != nil {
				return err
			}
			if notFound != "" {
				g.verdicts.WithLabelValues(networkOf(e), "not_found").Inc()
				return g.decideUnseen(ctx, e, state, payment.OutcomeNotFound, notFound)
			}
			verdict.Reason += "; past " + g.o.Timeout.String() + ", not evidence of not_found yet"
		default:
			// Mined and still canonical, only slow to finalize: a real
			// deposit is never failed for the chain's slowness.
			g.o.Alerts.Raise("finality_stalled", alert.Warning, "deposits mined but not final past FINALITY_TIMEOUT", map[string]any{
				"event_id": e.ID, "trace_id": e.TraceID, "tx_hash": e.TxHash,
			})
		}
	}
	if state.ReceiptSeen && !verdict.ReceiptSeen {
		logging.From(ctx).Warn().Msg("receipt seen before is gone: the transaction left the canonical chain")
	}
	return g.park(ctx, e, state, postgres.Wait{
		RecheckIn:   g.recheckAfter(state.Checks),
		ReceiptSeen: verdict.ReceiptSeen,
		BlockNumber: int64(verdict.BlockNumber),
		BlockHash:   verdict.BlockHash,
		Note:        verdict.Reason,
	})
}

// unseenEvidence decides whether a deposit whose receipt was never seen
// is not_found past FINALITY_TIMEOUT, by the rule reorged follows: one
// null is no evidence (a lagging or lying backend, or a deposit first
// checked late), only receipts absent on reads REORG_RECHECK_DELAY and a
// new block apart are. It says why, or "" while that is not shown.
func (g *Gate) unseenEvidence(ctx context.Context, e payment.Event, verdict chain.Verdict) (string, error) {
	if verdict.Head == 0 {
		// No head read (a receipt off the canonical chain, say): nothing
		// to count the blocks from.
		return "", nil
	}
	a, err := g.o.Store.RecordWaitAbsence(ctx, e, "", int64(verdict.Head), g.o.ReorgRecheckDelay)
	if err != nil || !a.Evidence {
		return "", err
	}
	return fmt.Sprintf("transaction not found within %s: no receipt on reads %s and %d blocks apart",
		g.o.Timeout, a.Since.Round(time.Second), int64(verdict.Head)-a.HeadThen), nil
}

// decideUnseen fails a deposit whose transaction the chain does not show
// (not_found, reorged), then asks once more. Mined (again) between the
// read that decided and the commit, it may have been reported meanwhile
// to a deposit still waiting, which reopens nothing, and nobody reports
// it again: seen now, the deposit is reopened (its transfer claim keeps
// it to one credit). A read that fails leaves it failed (a recheck, or
// the scanner at finality, reopens it).
func (g *Gate) decideUnseen(ctx context.Context, e payment.Event, state postgres.ChainWaitState, outcome payment.Outcome, reason string) error {
	moved, err := g.decided(ctx, e, outcome, reason, true)
	if err != nil || !moved {
		return err
	}
	log := logging.From(ctx)
	seen, err := g.minedNow(ctx, e, state.ToAddress)
	if err != nil {
		log.Warn().Err(err).Msg("could not ask the chain again about a deposit just failed; a recheck reopens it if it is mined")
		return nil
	}
	if !inChain(seen.State) {
		return nil
	}
	reopened, err := g.o.Store.ReopenDeposit(ctx, e.ID, []payment.Outcome{outcome},
		fmt.Sprintf("the transaction is in block %d, seen just after the deposit failed %s", seen.BlockNumber, outcome))
	if err == nil && reopened {
		log.Warn().Uint64("block", seen.BlockNumber).Msg("deposit's transaction mined just after it failed; reopened")
	}
	return err
}

// minedNow says where the chain shows a deposit's transaction: a receipt
// (perhaps a cached hint, or one lagging backend's) is taken only once
// the headers confirm its block, as the reorg watch takes it.
func (g *Gate) minedNow(ctx context.Context, e payment.Event, toAddress string) (chain.Canonicity, error) {
	v, _, err := g.verdict(ctx, e, toAddress, false)
	if err != nil || !v.ReceiptSeen {
		return chain.Canonicity{}, err
	}
	d, nc, _, err := g.claim(e, toAddress)
	if err != nil {
		return chain.Canonicity{}, err
	}
	return nc.Chain.StillCanonical(ctx, d, v.BlockNumber, v.BlockHash)
}

// evidence is what reorgEvidence found.
type evidence struct {
	// reorged says why the deposit left the chain; "" while nothing shows it.
	reorged string
	// found: the chain shows the transaction (Canonical, Final, Moved).
	found bool
	seen  chain.Canonicity
}

// reorgEvidence decides whether a deposit whose receipt was seen, and is
// missing now, left the chain. A single null is no
// evidence (the contract): the chain must show it, as it does for the
// reorg watcher. The block where it was seen replaced without it (Gone);
// or its receipt absent on two reads REORG_RECHECK_DELAY and a new block
// apart. Until then the deposit keeps waiting; evidence bounds that wait,
// since a receipt that stays away makes the second read evidence.
func (g *Gate) reorgEvidence(ctx context.Context, e payment.Event, state postgres.ChainWaitState) (evidence, error) {
	if state.BlockHash == "" {
		return evidence{seen: chain.Canonicity{Reason: "no block stored where the receipt was seen; nothing to compare"}}, nil
	}
	d, nc, _, err := g.claim(e, state.ToAddress)
	if err != nil {
		return evidence{}, err
	}
	seen, err := nc.Chain.StillCanonical(ctx, d, uint64(state.BlockNumber), state.BlockHash)
	if err != nil {
		return evidence{}, err
	}
	switch seen.State {
	case chain.Gone:
		return evidence{reorged: "receipt seen, then gone: " + seen.Reason, seen: seen}, nil
	case chain.Absent:
		a, err := g.o.Store.RecordWaitAbsence(ctx, e, state.BlockHash, int64(seen.Head), g.o.ReorgRecheckDelay)
		if err != nil {
			return evidence{}, err
		}
		if a.Evidence {
			return evidence{seen: seen, reorged: fmt.Sprintf("receipt seen in block %d %s, then absent on reads %s and %d blocks apart",
				state.BlockNumber, state.BlockHash, a.Since.Round(time.Second), int64(seen.Head)-a.HeadThen)}, nil
		}
		seen.Reason += "; not evidence yet"
		return evidence{seen: seen}, nil
	}
	return evidence{found: true, seen: seen}, nil
}

// Verdict asks the chain about a deposit as Check would, without parking
// or deciding anything: what a recheck shows an operator. toAddress is the
// recipient the provider named, if any.
func (g *Gate) Verdict(ctx context.Context, e payment.Event, toAddress string) (chain.Verdict, error) {
	v, _, err := g.verdict(ctx, e, toAddress, false)
	return v, err
}

// verdict asks the chain about a deposit; wantHead reads the head with a
// null receipt (chain.Deposit.WantHead).
func (g *Gate) verdict(ctx context.Context, e payment.Event, toAddress string, wantHead bool) (chain.Verdict, string, error) {
	deposit, nc, network, err := g.claim(e, toAddress)
	if err != nil {
		return chain.Verdict{}, network, err
	}
	deposit.WantHead = wantHead
	v, err := nc.Chain.CheckDeposit(ctx, deposit, nc.Policy)
	return v, network, err
}

// claim describes what the event claims of the chain, and the network
// chain to ask.
func (g *Gate) claim(e payment.Event, toAddress string) (chain.Deposit, NetworkChain, string, error) {
	describe := g.deposit
	if e.Type == payment.WithdrawalPost {
		describe = g.payout // a payment out, not a deposit (payout.go)
	}
	deposit, network, err := describe(e, toAddress)
	if err != nil {
		return chain.Deposit{}, NetworkChain{}, "", err
	}
	nc, ok := g.o.Networks[network]
	if !ok {
		// Not enabled in this worker, or enabled without an RPC under a
		// policy that needs one (refused at start): wait for an operator.
		return chain.Deposit{}, NetworkChain{}, network, payment.Unavailable("finality", fmt.Errorf("network %s %w (NETWORKS, RPC_URL_%s)", network, errNoRPCHere, network))
	}
	return deposit, nc, network, nil
}

// errNoRPCHere: the event's network is not enabled in this worker, or
// is enabled without the RPC its policy needs.
var errNoRPCHere = errors.New("has no RPC in this worker")

// networkOf is an event's network; events stored before networks existed
// name none and were ETH_MAINNET's.
func networkOf(e payment.Event) string {
	if e.Network != "" {
		return e.Network
	}
	return payment.DefaultNetwork
}

// deposit describes the event as the chain should confirm it.
func (g *Gate) deposit(e payment.Event, toAddress string) (chain.Deposit, string, error) {
	asset, units, err := g.baseUnits(e)
	if err != nil {
		return chain.Deposit{}, "", err
	}
	d := chain.Deposit{TxHash: e.TxHash, Token: asset.Contract, Amount: units, Index: e.TransferIndex}
	if payment.InternalTransfer(e.TransferIndex) {
		if !asset.Native() {
			return chain.Deposit{}, "", payment.Invalid("transfer %s moves the native coin, not %s", e.TransferIndex, asset.Code)
		}
		// Its trace frame's recipient is checked as a native one's.
		d.Internal = true
	}
	if toAddress != "" {
		d.Recipients = []string{toAddress}
		return d, asset.Network, nil
	}
	// A deposit named by user only: the Transfer (or the transaction's
	// value) must go to one of the user's registered addresses on the
	// asset's network, whichever of them the chain shows.
	d.Owner = owner{store: g.o.Store, network: asset.Network, user: e.UserID, native: asset.Native()}
	return d, asset.Network, nil
}

// baseUnits is the event's asset and its amount in the asset's base
// units, exactly.
func (g *Gate) baseUnits(e payment.Event) (payment.Asset, *big.Int, error) {
	asset, ok := g.o.Assets.Listing(networkOf(e), e.Asset)
	if !ok {
		return payment.Asset{}, nil, payment.Invalid("asset %s is not listed on network %s", e.Asset, networkOf(e))
	}
	units, ok := money.ToBaseUnits(e.Amount, asset.Decimals)
	if !ok {
		return payment.Asset{}, nil, payment.Invalid("amount %s has more digits than %s's %d decimals", e.Amount, asset.Code, asset.Decimals)
	}
	return asset, units, nil
}

// owner answers chain.AddressOwner from deposit_addresses. A native
// deposit of a user who registered no address on the network owns every
// address no other user registered: only its value is checked, as before
// addresses existed. A token deposit needs a registered address.
type owner struct {
	store   Store
	network string
	user    int64
	native  bool
}

func (o owner) Owned(ctx context.Context, addresses []string) ([]string, error) {
	owners, err := o.store.DepositAddressOwners(ctx, o.network, addresses)
	if err != nil {
		return nil, err
	}
	var owned []string
	for _, a := range addresses {
		if u, ok := owners[a]; ok && u == o.user {
			owned = append(owned, a)
		}
	}
	if len(owned) > 0 || !o.native {
		return owned, nil
	}
	registered, err := o.store.UserHasDepositAddress(ctx, o.network, o.user)
	if err != nil || registered {
		return nil, err
	}
	// Another user's address stays theirs.
	var unowned []string
	for _, a := range addresses {
		if _, ok := owners[a]; !ok {
			unowned = append(unowned, a)
		}
	}
	return unowned, nil
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
	_, err := g.decided(ctx, e, outcome, reason, raise)
	return err
}

// decided fails a deposit with outcome, and says whether this call did.
func (g *Gate) decided(ctx context.Context, e payment.Event, outcome payment.Outcome, reason string, raise bool) (bool, error) {
	moved, err := g.o.Store.DecideChainOutcome(ctx, e, outcome, reason)
	if err != nil || !moved {
		return false, err
	}
	logging.From(ctx).Warn().Str("outcome", string(outcome)).Str("reason", reason).Msg("deposit refused by the chain")
	if raise {
		g.o.Alerts.Raise("deposit_"+string(outcome), alert.Warning, "deposit refused by the chain: "+string(outcome), map[string]any{
			"event_id": e.ID, "trace_id": e.TraceID, "tx_hash": e.TxHash, "reason": reason,
		})
	}
	return true, nil
}

// WatchReorgs follows credited, not yet final deposits: final ones stop
// being watched, ones mined again in another block keep their credit and
// their evidence moves there, and ones the chain shows gone (see
// watchOne) get their compensation event, once however often it is seen.
// Settled posts confirmed before finality are followed alike, but one
// whose payout is gone is only reported (payoutReorged).
// A deposit the chain could not be asked about goes to the back of the
// list; an outage ends its network's pass, but not a node's lack of the
// debug API, which only the internal deposit asking for it waits on.
func (g *Gate) WatchReorgs(ctx context.Context) error {
	// Only the networks this worker can ask, each its own share: one
	// network down, or with many rows, never takes the others' turn.
	networks := slices.Sorted(maps.Keys(g.o.Networks))
	if len(networks) == 0 {
		return nil
	}
	watched, err := g.o.Store.WatchedDeposits(ctx, networks, max(WatchBatchMax/len(networks), 1))
	if err != nil {
		return err
	}
	var unchecked error
	down := map[string]bool{}
	for _, w := range watched {
		network := watchedNetwork(w)
		nc := g.o.Networks[network]
		if down[network] {
			continue // down this pass: its next rows wait their turn
		}
		seen, askErr := g.stillCanonical(ctx, nc, network, w)
		if errors.Is(askErr, chain.ErrTxTraceUnsupported) {
			// An internal deposit mined again elsewhere, on a node without
			// the debug API: not an outage (it answers so every time), so
			// only this deposit waits, still credited and watched.
			g.watched.WithLabelValues(network, "untraced").Inc()
			g.untracedAt.WithLabelValues(network, "watch").Set(float64(g.o.Now().UnixNano()) / 1e9)
			g.o.Log.Warn().Err(askErr).Str("network", network).Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).
				Str("setting", InternalCheckSetting(network)).
				Msgf("reorg watch: an internal deposit's transaction is in another block now, and without the debug API it cannot be told whether it still pays the deposit; "+
					"it stays credited and watched until %s is an endpoint with the debug API, or %s=status", rpcSettingOf(network), InternalCheckSetting(network))
			if unchecked == nil {
				unchecked = fmt.Errorf("reorg watch of %s: %w", w.EventID, askErr)
			}
			if err := g.o.Store.TouchWatched(ctx, w.EventID); err != nil {
				return err
			}
			continue
		}
		if askErr != nil {
			g.watched.WithLabelValues(network, "error").Inc()
			g.o.Log.Warn().Err(askErr).Str("trace_id", w.TraceID).Str("event_id", w.EventID).Msg("reorg watch could not ask the chain; not evidence")
			if unchecked == nil {
				unchecked = fmt.Errorf("reorg watch of %s: %w", w.EventID, askErr)
			}
			if err := g.o.Store.TouchWatched(ctx, w.EventID); err != nil {
				return err
			}
			if errors.Is(askErr, payment.ErrUnavailable) {
				// That network is down: the others are still watched.
				down[network] = true
			}
			continue
		}
		g.watched.WithLabelValues(network, string(seen.State)).Inc()
		if err := g.watchOne(ctx, w, seen); err != nil {
			return err
		}
	}
	return unchecked
}

// stillCanonical asks where a watched deposit's transaction is now, with
// what the deposit claims: a transaction mined again elsewhere keeps the
// credit only if it still pays it.
func (g *Gate) stillCanonical(ctx context.Context, nc NetworkChain, network string, w postgres.WatchedDeposit) (chain.Canonicity, error) {
	describe := g.deposit
	if w.Type == payment.WithdrawalPost {
		describe = g.payout // it must still pay the hold's amount to its address
	}
	d, _, err := describe(payment.Event{
		TxHash: w.TxHash, UserID: w.UserID, Asset: w.Asset, Amount: w.Amount, Network: network, TransferIndex: w.TransferIndex,
	}, w.ToAddress)
	if err != nil {
		return chain.Canonicity{}, err
	}
	d.LogPosition = w.LogPosition
	return nc.Chain.StillCanonical(ctx, d, uint64(w.BlockNumber), w.BlockHash)
}

// watchOne acts on what the chain showed about one watched deposit. Gone
// is evidence at once; Absent becomes evidence only on a second read at
// least ReorgRecheckDelay (on the database's clock) and one new block
// after the first: a single null, or a lagging backend, never is.
func (g *Gate) watchOne(ctx context.Context, w postgres.WatchedDeposit, seen chain.Canonicity) error {
	log := g.o.Log.With().Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).Logger()
	switch seen.State {
	case chain.Final:
		givenBack, err := g.o.Store.MarkFinal(ctx, w.EventID)
		if givenBack {
			g.givenBack(w)
		}
		return err
	case chain.Canonical:
		return g.o.Store.KeepWatching(ctx, w.EventID)
	case chain.Moved:
		moved, givenBack, err := g.o.Store.MoveEvidence(ctx, w.EventID, w.BlockHash, int64(seen.BlockNumber), seen.BlockHash, seen.Final)
		if err == nil && moved {
			log.Warn().Int64("from_block", w.BlockNumber).Str("from_hash", w.BlockHash).
				Uint64("block", seen.BlockNumber).Str("block_hash", seen.BlockHash).Bool("final", seen.Final).
				Msg("credited deposit's transaction mined again in another block; credit kept, evidence moved")
		}
		if givenBack {
			g.givenBack(w)
		}
		return err
	case chain.Absent:
		a, err := g.o.Store.RecordAbsence(ctx, w.EventID, w.BlockHash, int64(seen.Head), g.o.ReorgRecheckDelay)
		if err != nil || !a.Evidence {
			if err == nil {
				// Every pass while it lasts: the first at info, the rest at debug.
				event := log.Debug()
				if a.First {
					event = log.Info()
				}
				event.Bool("first", a.First).Dur("absent_for", a.Since).Int64("head_then", a.HeadThen).Uint64("head", seen.Head).
					Str("chain", seen.Reason).Msg("credited deposit's receipt missing; not evidence yet")
			}
			return err
		}
		return g.gone(ctx, w, fmt.Sprintf("transaction %s: receipt absent on reads %s and %d blocks apart (block %d %s)",
			w.TxHash, a.Since.Round(time.Second), int64(seen.Head)-a.HeadThen, w.BlockNumber, w.BlockHash))
	case chain.Gone:
		return g.gone(ctx, w, fmt.Sprintf("transaction %s left the canonical chain: %s", w.TxHash, seen.Reason))
	}
	return fmt.Errorf("reorg watch of %s: chain returned unknown state %q", w.EventID, seen.State)
}

// givenBack says that a compensated deposit watched again is final on the
// chain and its compensation reversed.
func (g *Gate) givenBack(w postgres.WatchedDeposit) {
	g.o.Log.Warn().Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).
		Msg("compensated deposit's transaction is final on the chain again; given back")
	// The compensation raised a critical alert: say that it is undone.
	g.o.Alerts.Raise("deposit_given_back:"+w.EventID, alert.Warning, "a compensated deposit is final on the chain again; given back", map[string]any{
		"event_id": w.EventID, "trace_id": w.TraceID, "tx_hash": w.TxHash,
	})
}

// gone acts on evidence that a watched transaction left the chain: a
// deposit is compensated, a post's payout only reported.
func (g *Gate) gone(ctx context.Context, w postgres.WatchedDeposit, reason string) error {
	if w.Type == payment.WithdrawalPost {
		return g.payoutReorged(ctx, w, reason)
	}
	return g.reverse(ctx, w, reason)
}

// payoutReorged reports a settled post whose payout transaction left the
// canonical chain: the user stays debited and the hold posted, while the
// payout may never land. Whether to send it again or credit the user back
// is an operator's decision (docs/runbooks/SettlePayoutReorged.md), so no
// money moves here: the evidence is recorded on the post, counted, and
// raised, once.
func (g *Gate) payoutReorged(ctx context.Context, w postgres.WatchedDeposit, reason string) error {
	marked, err := g.o.Store.MarkPayoutReorged(ctx, w.EventID, w.BlockHash, reason)
	if err != nil || !marked {
		return err
	}
	network := watchedNetwork(w)
	g.payouts.WithLabelValues(network).Inc()
	g.o.Log.Error().Str("network", network).Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("hold_id", w.HoldID).
		Str("tx_hash", w.TxHash).Int64("block", w.BlockNumber).Str("block_hash", w.BlockHash).Str("reason", reason).
		Msg("settled payout's transaction left the canonical chain; the user stays debited: an operator must re-send the payout or credit it back")
	g.o.Alerts.Raise("payout_reorged:"+w.EventID, alert.Critical, "a settled payout's transaction left the canonical chain; the user stays debited", map[string]any{
		"network": network, "event_id": w.EventID, "hold_id": w.HoldID, "trace_id": w.TraceID, "tx_hash": w.TxHash,
		"user_id": w.UserID, "asset": w.Asset, "amount": w.Amount.String(), "to_address": w.ToAddress, "reason": reason,
	})
	return nil
}

// reverse compensates a credited deposit the chain shows gone.
func (g *Gate) reverse(ctx context.Context, w postgres.WatchedDeposit, reason string) error {
	r, err := g.o.Store.ReverseDeposit(ctx, w.EventID, reason, w.TraceID)
	if err != nil {
		return err
	}
	g.o.Log.Warn().Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).Str("reversal", r.String()).
		Str("reason", reason).Msg("credited deposit reorged away")
	g.o.Alerts.Raise("deposit_reorged:"+w.EventID, alert.Critical, "credited deposit left the canonical chain; compensating", map[string]any{
		"event_id": w.EventID, "trace_id": w.TraceID, "tx_hash": w.TxHash, "reversal": r.String(),
	})
	if r != postgres.Compensating {
		return nil
	}
	return g.lookAgain(ctx, w)
}

// lookAgain asks the chain once more about a deposit just compensated. A
// transaction mined again between the watch's read and the compensation's
// commit may have been scanned or re-reported while the deposit was still
// credited, which gives nothing back, and nobody reports it again. A read
// after the commit sees any such block: in the chain now, the deposit is
// watched again and given back once final, as if it had been reported.
// A read that fails leaves it compensated (the recheck is the way out).
func (g *Gate) lookAgain(ctx context.Context, w postgres.WatchedDeposit) error {
	network := watchedNetwork(w)
	nc, ok := g.o.Networks[network]
	if !ok {
		return nil
	}
	log := g.o.Log.With().Str("trace_id", w.TraceID).Str("event_id", w.EventID).Str("tx_hash", w.TxHash).Logger()
	seen, err := g.stillCanonical(ctx, nc, network, w)
	if err != nil {
		log.Warn().Err(err).Msg("could not look at a compensated deposit's transaction again; a recheck gives it back if it is mined again")
		return nil
	}
	if !inChain(seen.State) {
		return nil
	}
	r, err := g.o.Store.ReturnDeposit(ctx, w.EventID, payment.Transfer{}, true,
		fmt.Sprintf("the transaction is in block %d again (%s), seen just after its compensation", seen.BlockNumber, seen.State))
	if err != nil {
		return err
	}
	log.Warn().Str("return", r.String()).Uint64("block", seen.BlockNumber).Str("chain", string(seen.State)).
		Msg("compensated deposit's transaction is in the chain again; watched again")
	return nil
}

// watchedNetwork is a watched deposit's network; deposits stored before
// networks existed name none and were ETH_MAINNET's.
func watchedNetwork(w postgres.WatchedDeposit) string {
	if w.Network != "" {
		return w.Network
	}
	return payment.DefaultNetwork
}

// inChain tells whether the chain shows a transaction in a block its
// headers confirm (where it was, or mined again elsewhere).
func inChain(s chain.CanonicalState) bool {
	return s == chain.Canonical || s == chain.Final || s == chain.Moved
}
