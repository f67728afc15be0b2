// Package intake is the use case every provider route shares: a
// provider's package verifies and decodes a delivery into reported
// transfers; the intake keeps those on enabled networks, finds their
// owners through deposit_addresses and stores each as the deposit event
// its transfer identity names, counts duplicates, and handles a
// provider's reorg reports (the chain decides where it can be asked). It
// serves no HTTP and holds no SQL: the route answers, storage is behind
// Store. A fourth provider is one more package and one more route.
package intake

import (
	"context"
	"errors"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Store is the storage the intake needs; *postgres.DB implements it (the
// api's group commit wraps its InsertEvent).
type Store interface {
	// DepositAddressOwners maps each known address of the network to its
	// user.
	DepositAddressOwners(ctx context.Context, network string, addresses []string) (map[string]int64, error)
	InsertEvent(ctx context.Context, e postgres.NewEvent) (bool, error)
	// RecordReports notes which provider reported which transfers.
	RecordReports(ctx context.Context, reporter string, events []string) error
	ReverseDeposit(ctx context.Context, eventID, reason, traceID string) (postgres.Reversal, error)
	ReopenDeposit(ctx context.Context, eventID string, outcomes []payment.Outcome, reason string) (bool, error)
	// ReturnDeposit gives back (or watches again, when watch) a credited
	// deposit that was compensated for a reorg and is reported again.
	ReturnDeposit(ctx context.Context, eventID string, t payment.Transfer, watch bool, reason string) (postgres.Return, error)
	HurryFinalityCheck(ctx context.Context, eventID string) (postgres.Hurry, error)
	// SightTransfer records a report naming its block and brings the
	// transfer's deposit in line with all such reports (no RPC).
	SightTransfer(ctx context.Context, s postgres.Sighting) (postgres.Sighted, error)
	// SupersedeDeposit lets a conflicting report replace a deposit of the
	// same transfer that ended failed/mismatch; any other is refused.
	SupersedeDeposit(ctx context.Context, e postgres.NewEvent, reporter string) (postgres.SupersedeResult, error)
}

var _ Store = (*postgres.DB)(nil)

// Outcomes of a reported transfer: the outcome label of the providers'
// webhook metric.
const (
	OutcomeAccepted  = "accepted"
	OutcomeDuplicate = "duplicate"
	OutcomeIgnored   = "ignored"
	OutcomeReversed  = "reversed"
	// OutcomeRechecked: a removed transfer handed to the chain to decide.
	OutcomeRechecked = "rechecked"
	// OutcomeReopened: a failed/reorged deposit reported again.
	OutcomeReopened = "reopened"
	// OutcomeSuperseded: a report whose content replaced a deposit of the
	// same transfer that the chain had contradicted (failed/mismatch).
	OutcomeSuperseded = "superseded"
)

// Reasons a transfer is ignored by the intake (the decoders' own come
// from payment and their packages).
const (
	ReasonUnknownAddress    payment.IgnoreReason = "unknown_address"
	ReasonNetworkDisabled   payment.IgnoreReason = "network_disabled"
	ReasonConflict          payment.IgnoreReason = "conflict"
	ReasonRemovedUnknown    payment.IgnoreReason = "removed_unknown"
	ReasonRemovedNotDeposit payment.IgnoreReason = "removed_not_deposit"
	ReasonRefused           payment.IgnoreReason = "refused_by_storage"
	// ReasonRemovedFinal: a removed transfer whose deposit is credited and
	// final; the chain outranks the report.
	ReasonRemovedFinal payment.IgnoreReason = "removed_final"
	// ReasonRemovedFailed: a removed transfer whose deposit failed already.
	ReasonRemovedFailed payment.IgnoreReason = "removed_failed"
	// ReasonRemovedSeenElsewhere: a transfer removed from one block that
	// its providers report in another block not removed (no RPC).
	ReasonRemovedSeenElsewhere payment.IgnoreReason = "removed_seen_elsewhere"
	// ReasonReplayed: a removed transfer in an exact copy of a delivery
	// handled already; the first copy was acted on.
	ReasonReplayed payment.IgnoreReason = "replayed"
)

// chainStateWatching marks a deposit credited before finality.
const chainStateWatching = "watching"

// Provider names a reporter of transfers: the label of its metrics and
// logs, and the source of the events it stores first.
type Provider struct {
	Name   string
	Source postgres.Source
}

// Options wire an Intake.
type Options struct {
	Store Store
	// NetworkEnabled tells whether events on a network are settled here
	// (NETWORKS); another network's transfer is ignored and counted.
	NetworkEnabled func(network string) bool
	// HasRPC tells whether a network's chain can be asked: then a
	// provider's reorg report is a reason to ask, never evidence by
	// itself. Nil: no chain is.
	HasRPC func(network string) bool
	// Count is told each transfer's outcome (and reason when ignored).
	// Nil: nothing counts.
	Count func(provider, outcome string, reason payment.IgnoreReason)
}

// Intake turns reported transfers into deposit events.
type Intake struct{ o Options }

// New builds an intake.
func New(o Options) *Intake {
	if o.HasRPC == nil {
		o.HasRPC = func(string) bool { return false }
	}
	if o.Count == nil {
		o.Count = func(string, string, payment.IgnoreReason) {}
	}
	return &Intake{o: o}
}

// Answer is what one delivery came to, every provider route's 200.
// Accepted counts events newly stored by this delivery; a transfer
// already an event counts under Duplicates.
type Answer struct {
	Status     string `json:"status"`
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	// Reopened counts duplicates of failed/reorged deposits sent back to
	// the ledger; Rechecked removed transfers the chain decides about
	// (with an RPC), Reversed those the flag reversed (without one);
	// Superseded failed/mismatch deposits this delivery's content replaced.
	Reopened   int    `json:"reopened"`
	Superseded int    `json:"superseded,omitempty"`
	Rechecked  int    `json:"rechecked"`
	Reversed   int    `json:"reversed"`
	Ignored    int    `json:"ignored"`
	TraceID    string `json:"trace_id"`
}

// Run is one delivery going through the intake.
type Run struct {
	in      *Intake
	p       Provider
	traceID string
	answer  Answer
	// reported are the events whose transfer this delivery named (new or
	// not): who saw which transfer, for the console and the miss rate.
	reported []string
	// replay: the delivery is an exact copy of one handled already (see
	// Replay).
	replay bool
}

// Replay marks the run as an exact copy of a delivery handled already
// (a captured request sent again). It stores the transfers that are not
// events yet, as any delivery would, and counts those that are under
// duplicates, but acts on none of them: it reopens, gives back, sights
// and rechecks nothing, and ignores its removed transfers, so a replay
// cannot undo what a later report decided.
func (r *Run) Replay() { r.replay = true }

// Start begins a delivery of p's in the trace traceID.
func (in *Intake) Start(p Provider, traceID string) *Run {
	return &Run{in: in, p: p, traceID: traceID, answer: Answer{Status: OutcomeAccepted, TraceID: traceID}}
}

// Answer is the delivery's answer so far.
func (r *Run) Answer() Answer { return r.answer }

// Ignore counts a candidate that is no deposit, with its reason.
func (r *Run) Ignore(reason payment.IgnoreReason) {
	r.answer.Ignored++
	r.in.o.Count(r.p.Name, OutcomeIgnored, reason)
}

func (r *Run) count(outcome string) { r.in.o.Count(r.p.Name, outcome, "") }

// Store turns transfers into deposit events. Only a storage failure is an
// error, returned as the store gave it (the provider retries, which is
// safe: every id comes from the transfer).
func (r *Run) Store(ctx context.Context, transfers []payment.ReportedTransfer) error {
	store := r.in.o.Store
	log := logging.From(ctx)
	byNetwork := map[string][]string{}
	seen := map[string]bool{}
	kept := transfers[:0:0]
	for _, t := range transfers {
		if !r.in.o.NetworkEnabled(t.Network) {
			r.Ignore(ReasonNetworkDisabled)
			continue
		}
		kept = append(kept, t)
		if key := t.Network + "/" + t.ToAddress; (!t.Removed || r.storable(t) || r.sights(t)) && !seen[key] {
			seen[key] = true
			byNetwork[t.Network] = append(byNetwork[t.Network], t.ToAddress)
		}
	}
	// The recipient's owner comes only from deposit_addresses on the
	// transfer's network: a provider knows addresses, never users.
	owners := map[string]map[string]int64{}
	for network, recipients := range byNetwork {
		found, err := store.DepositAddressOwners(ctx, network, recipients)
		if err != nil {
			return err
		}
		owners[network] = found
	}
	for _, t := range kept {
		if t.Removed && !r.storable(t) && r.replay {
			r.Ignore(ReasonReplayed)
			continue
		}
		if t.Removed && !r.storable(t) {
			var err error
			if _, known := owners[t.Network][t.ToAddress]; known && r.sights(t) {
				err = r.sight(ctx, t)
			} else {
				err = r.removed(ctx, t)
			}
			if err != nil {
				return err
			}
			continue
		}
		user, ok := owners[t.Network][t.ToAddress]
		if !ok {
			r.Ignore(ReasonUnknownAddress)
			continue
		}
		event := postgres.NewEvent{
			Event: payment.Event{
				ID: t.EventID(), Type: payment.Deposit, UserID: user, Asset: t.Asset.Code,
				Amount: t.Amount, TxHash: t.TxHash, TransferIndex: t.Index, TraceID: r.traceID, Network: t.Network,
			},
			Source:    r.p.Source,
			ToAddress: t.ToAddress,
		}
		inserted, err := store.InsertEvent(ctx, event)
		switch {
		case errors.Is(err, payment.ErrConflict) && !t.Removed && !r.replay:
			if err := r.conflict(ctx, event, err); err != nil {
				return err
			}
		case errors.Is(err, payment.ErrConflict):
			r.Ignore(ReasonConflict)
			log.Error().Err(err).Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Msg("provider transfer conflicts with the stored deposit")
		case errors.Is(err, payment.ErrInvalid):
			r.Ignore(ReasonRefused)
			log.Error().Err(err).Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Msg("provider deposit refused by storage")
		case err != nil:
			return err
		case inserted:
			r.reported = append(r.reported, t.EventID())
			r.answer.Accepted++
			r.count(OutcomeAccepted)
			log.Info().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Int64(logging.FieldUserID, user).
				Str("asset", t.Asset.Code).Msg("provider deposit")
			if r.sights(t) {
				if err := r.sight(ctx, t); err != nil {
					return err
				}
				break
			}
			// The transfer may be claimed by a deposit /webhook/payments
			// named that a reorg compensated since (this event then ends
			// duplicate_transfer).
			if err := r.returned(ctx, "", t); err != nil {
				return err
			}
		case r.replay:
			r.reported = append(r.reported, t.EventID())
			r.answer.Duplicates++
			r.count(OutcomeDuplicate)
		case t.Removed:
			// A reorged transfer settle already holds: the chain decides.
			if err := r.removed(ctx, t); err != nil {
				return err
			}
		case r.sights(t):
			r.reported = append(r.reported, t.EventID())
			r.answer.Duplicates++
			r.count(OutcomeDuplicate)
			if err := r.sight(ctx, t); err != nil {
				return err
			}
		default:
			r.reported = append(r.reported, t.EventID())
			if err := r.again(ctx, t); err != nil {
				return err
			}
		}
	}
	r.recordReports(ctx)
	return nil
}

// recordReports notes this provider's reports. A failure is logged, not
// answered: the events are stored, and the record is observability only.
func (r *Run) recordReports(ctx context.Context) {
	if len(r.reported) == 0 {
		return
	}
	if err := r.in.o.Store.RecordReports(ctx, r.p.Name, r.reported); err != nil {
		logging.From(ctx).Warn().Err(err).Str("provider", r.p.Name).Int("events", len(r.reported)).Msg("could not record which transfers the provider reported")
	}
}

// storable tells whether a removed transfer is stored anyway: one sent
// again on a reorg's new branch, where the chain can be asked.
func (r *Run) storable(t payment.ReportedTransfer) bool {
	return t.Removed && t.Reorged && r.in.o.HasRPC(t.Network)
}

// sights tells whether a report is judged together with the transfer's
// other reports by block (SightTransfer): one that names its block, on a
// network whose chain cannot be asked, where the reports are the only
// evidence and may arrive in any order.
func (r *Run) sights(t payment.ReportedTransfer) bool {
	return t.BlockHash != "" && !r.in.o.HasRPC(t.Network)
}

// sight records a report of t in its block, and counts what bringing its
// deposit in line with every such report did: reversed when no reported
// block is left (a removal, or an add redelivered after its block's
// removal), reopened or given back when one is again.
func (r *Run) sight(ctx context.Context, t payment.ReportedTransfer) error {
	log := logging.From(ctx)
	reason := r.p.Name + " reported the transfer again"
	if t.Removed {
		reason = r.p.Name + " reported the transfer as removed by a reorg"
	}
	s, err := r.in.o.Store.SightTransfer(ctx, postgres.Sighting{
		Transfer: t.Transfer, BlockHash: t.BlockHash, Removed: t.Removed,
		Reporter: r.p.Name, Reason: reason, TraceID: r.traceID,
	})
	switch {
	case errors.Is(err, payment.ErrInvalid) && t.Removed:
		r.Ignore(ReasonRemovedNotDeposit)
		return nil
	case err != nil:
		return err
	}
	event := log.With().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Str("block_hash", t.BlockHash).Logger()
	switch {
	case !s.Known:
		r.Ignore(ReasonRemovedUnknown)
	case s.Reversal == postgres.AlreadyFailed && t.Removed:
		r.Ignore(ReasonRemovedFailed)
	case s.Reversal == postgres.Voided || s.Reversal == postgres.Compensating:
		r.answer.Reversed++
		r.count(OutcomeReversed)
		msg := "provider deposit reversed"
		if !t.Removed {
			msg = "a provider reports a transfer in a block it reported removed; the deposit is reversed"
		}
		event.Warn().Str("reversal", s.Reversal.String()).Msg(msg)
	case s.Reopened || s.Return == postgres.GivenBack:
		r.answer.Reopened++
		r.count(OutcomeReopened)
		event.Warn().Bool("given_back", s.Return == postgres.GivenBack).Msg("a provider reports a reorged deposit on the chain again; reopened or given back")
	case s.Return == postgres.CyclesExhausted:
		event.Error().Msg("a provider reports a compensated deposit again, but it was reorged away and back too often; it stays compensated for a human to decide")
	case t.Removed && s.OnChain:
		r.Ignore(ReasonRemovedSeenElsewhere)
		event.Info().Msg("a provider reports the transfer removed from one block and on the chain in another; nothing reversed")
	}
	return nil
}

// removed handles a transfer a provider reports taken away by a reorg.
// Where the chain can be asked, it decides: a deposit waiting for
// finality is checked at once, one in flight is checked anyway, a
// credited one under watch is left to the reorg watcher, and a final one
// stays credited (the report is logged). Where it cannot, the report
// itself is the evidence and the deposit is reversed.
func (r *Run) removed(ctx context.Context, t payment.ReportedTransfer) error {
	store := r.in.o.Store
	log := logging.From(ctx)
	if !r.in.o.HasRPC(t.Network) {
		reversal, err := store.ReverseDeposit(ctx, t.EventID(), r.p.Name+" reported the transfer as removed by a reorg", r.traceID)
		switch {
		case errors.Is(err, payment.ErrNotFound):
			r.Ignore(ReasonRemovedUnknown)
		case errors.Is(err, payment.ErrInvalid):
			r.Ignore(ReasonRemovedNotDeposit)
		case err != nil:
			return err
		default:
			r.answer.Reversed++
			r.count(OutcomeReversed)
			log.Warn().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Str("reversal", reversal.String()).Msg("provider deposit reversed")
		}
		return nil
	}
	h, err := store.HurryFinalityCheck(ctx, t.EventID())
	switch {
	case errors.Is(err, payment.ErrNotFound):
		r.Ignore(ReasonRemovedUnknown)
		return nil
	case err != nil:
		return err
	case !h.Type.Credit():
		r.Ignore(ReasonRemovedNotDeposit)
		return nil
	case h.Status == payment.StatusFailed:
		r.Ignore(ReasonRemovedFailed)
		return nil
	case h.Status == payment.StatusConfirmed && h.ChainState != chainStateWatching:
		// Credited and final (or credited with nothing to watch): a
		// provider's report does not outrank a finalized block.
		r.Ignore(ReasonRemovedFinal)
		log.Warn().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Str("chain_state", h.ChainState).
			Msg("a provider reports a credited, final deposit removed; the chain says otherwise, nothing reversed")
		return nil
	}
	r.answer.Rechecked++
	r.count(OutcomeRechecked)
	log.Info().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Str("status", string(h.Status)).Bool("hurried", h.Hurried).
		Msg("a provider reports the deposit removed; the chain decides")
	return nil
}

// again handles a transfer that is already an event: one that ended
// failed/reorged is seen again, so it is reopened, and the finality gate
// credits it once the chain's policy holds (or at once without an RPC,
// where the provider's word is the evidence either way); one credited and
// then compensated for a reorg is given back.
func (r *Run) again(ctx context.Context, t payment.ReportedTransfer) error {
	r.answer.Duplicates++
	r.count(OutcomeDuplicate)
	reopened, err := r.in.o.Store.ReopenDeposit(ctx, t.EventID(), []payment.Outcome{payment.OutcomeReorged}, r.p.Name+" reported the transfer again")
	if err != nil {
		return err
	}
	if reopened {
		r.answer.Reopened++
		r.count(OutcomeReopened)
		logging.From(ctx).Warn().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Msg("a provider reports a reorged deposit again; reopened")
		return nil
	}
	return r.returned(ctx, t.EventID(), t)
}

// returned gives back a credited deposit compensated for a reorg whose
// transfer is reported again: the event eventID, or the deposit holding
// the transfer's claim under another id. It is given back at once where
// the report is the evidence, once the chain shows it finalized where the
// chain can be asked.
func (r *Run) returned(ctx context.Context, eventID string, t payment.ReportedTransfer) error {
	back, err := r.in.o.Store.ReturnDeposit(ctx, eventID, t.Transfer, r.in.o.HasRPC(t.Network), r.p.Name+" reported the transfer again")
	if err != nil {
		return err
	}
	switch back {
	case postgres.GivenBack, postgres.WatchedAgain:
		r.answer.Reopened++
		r.count(OutcomeReopened)
		logging.From(ctx).Warn().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).Str("return", back.String()).
			Msg("a provider reports a compensated deposit again; its compensation is reversed")
	case postgres.CyclesExhausted:
		logging.From(ctx).Error().Str("provider", r.p.Name).Str(logging.FieldEventID, t.EventID()).
			Msg("a provider reports a compensated deposit again, but it was reorged away and back too often; it stays compensated for a human to decide")
	}
	return nil
}

// conflict handles a transfer stored before with other content. A
// deposit the chain contradicted (failed/mismatch: a provider's wrong
// report, no money moved) takes this report's content and goes through
// the finality gate again; any other stays as it is, since it may move
// money or has, and a human must look.
func (r *Run) conflict(ctx context.Context, e postgres.NewEvent, conflict error) error {
	log := logging.From(ctx)
	result, err := r.in.o.Store.SupersedeDeposit(ctx, e, r.p.Name)
	if err != nil {
		return err
	}
	switch result {
	case postgres.SupersedeDone:
		r.reported = append(r.reported, e.Event.ID)
		r.answer.Superseded++
		r.count(OutcomeSuperseded)
		log.Warn().Str("provider", r.p.Name).Str(logging.FieldEventID, e.Event.ID).Int64(logging.FieldUserID, e.Event.UserID).
			Str("asset", e.Event.Asset).Msg("provider transfer supersedes a stored deposit the chain contradicted (failed mismatch); reopened with the new content")
	case postgres.SupersedeSame:
		// Another report superseded it with this content first.
		r.reported = append(r.reported, e.Event.ID)
		r.answer.Duplicates++
		r.count(OutcomeDuplicate)
	default:
		r.Ignore(ReasonConflict)
		log.Error().Err(conflict).Str("provider", r.p.Name).Str(logging.FieldEventID, e.Event.ID).
			Msg("provider transfer conflicts with the stored deposit; once that deposit failed mismatch, a rescan of its block supersedes it")
	}
	return nil
}
