package httpapi

import (
	"context"
	"errors"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// Outcomes and reasons of provider reorg reports.
const (
	// outcomeRechecked: a removed log handed to the chain to decide.
	outcomeRechecked = "rechecked"
	// outcomeReopened: a failed/reorged deposit reported again.
	outcomeReopened = "reopened"
	// reasonRemovedFinal: a removed log whose deposit is credited and
	// final; the chain outranks the report.
	reasonRemovedFinal = "removed_final"
	// reasonRemovedFailed: a removed log whose deposit failed already.
	reasonRemovedFailed = "removed_failed"
	reopenReason        = "alchemy reported the transfer again"
)

// hasRPC tells whether the chain of a network can be asked: then a
// provider's reorg report is a reason to ask, never evidence by itself.
// The api has one ETH_RPC_URL, which serves every network it knows.
func (s *Server) hasRPC(string) bool { return s.chain != nil }

// alchemyRemoved handles a log Alchemy reports removed. Where the chain
// can be asked, it decides: a deposit waiting for finality is checked at
// once, one in flight is checked anyway, a credited one under watch is
// left to the reorg watcher, and a final one stays credited (the report is
// logged). Where it cannot, the flag itself is the evidence and the
// deposit is reversed.
func (s *Server) alchemyRemoved(ctx context.Context, t alchemy.Transfer, traceID string, answer *alchemyAnswer, ignore func(reason string)) error {
	log := logging.From(ctx)
	if !s.hasRPC(t.Network) {
		reversal, err := s.store.ReverseDeposit(ctx, t.EventID, reversalReason, traceID)
		switch {
		case errors.Is(err, payment.ErrNotFound):
			ignore(reasonRemovedUnknown)
		case errors.Is(err, payment.ErrInvalid):
			ignore(reasonRemovedNotDeposit)
		case err != nil:
			return storeError(err)
		default:
			answer.Reversed++
			s.metrics.webhook(sourceAlchemy, outcomeReversed, "")
			log.Warn().Str(logging.FieldEventID, t.EventID).Str("reversal", reversal.String()).Msg("alchemy deposit reversed")
		}
		return nil
	}
	h, err := s.store.HurryFinalityCheck(ctx, t.EventID)
	switch {
	case errors.Is(err, payment.ErrNotFound):
		ignore(reasonRemovedUnknown)
		return nil
	case err != nil:
		return storeError(err)
	case !h.Type.Credit():
		ignore(reasonRemovedNotDeposit)
		return nil
	case h.Status == payment.StatusFailed:
		ignore(reasonRemovedFailed)
		return nil
	case h.Status == payment.StatusConfirmed && h.ChainState != chainStateWatching:
		// Credited and final (or credited with nothing to watch): a
		// provider's report does not outrank a finalized block.
		ignore(reasonRemovedFinal)
		log.Warn().Str(logging.FieldEventID, t.EventID).Str("chain_state", h.ChainState).
			Msg("alchemy reports a credited, final deposit removed; the chain says otherwise, nothing reversed")
		return nil
	}
	answer.Rechecked++
	s.metrics.webhook(sourceAlchemy, outcomeRechecked, "")
	log.Info().Str(logging.FieldEventID, t.EventID).Str("status", string(h.Status)).Bool("hurried", h.Hurried).
		Msg("alchemy reports the deposit removed; the chain decides")
	return nil
}

// chainStateWatching marks a deposit credited before finality.
const chainStateWatching = "watching"

// alchemyAgain handles a transfer that is already an event: one that
// ended failed/reorged is seen again, so it is reopened, and the finality
// gate credits it once the chain's policy holds (or at once without an
// RPC, where the provider's word is the evidence either way).
func (s *Server) alchemyAgain(ctx context.Context, t alchemy.Transfer, answer *alchemyAnswer) error {
	answer.Duplicates++
	s.metrics.webhook(sourceAlchemy, outcomeDuplicate, "")
	reopened, err := s.store.ReopenDeposit(ctx, t.EventID, []payment.Outcome{payment.OutcomeReorged}, reopenReason)
	if err != nil {
		return storeError(err)
	}
	if reopened {
		answer.Reopened++
		s.metrics.webhook(sourceAlchemy, outcomeReopened, "")
		logging.From(ctx).Warn().Str(logging.FieldEventID, t.EventID).Msg("alchemy reports a reorged deposit again; reopened")
	}
	return nil
}
