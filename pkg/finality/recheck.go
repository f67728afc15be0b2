package finality

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// What a recheck records as the chain's answer besides a verdict state.
const (
	ChainNotAsked    = "not_asked"
	ChainUnavailable = "unavailable"
)

// RecheckStore is the database side of a recheck; *postgres.DB
// implements it.
type RecheckStore interface {
	RecheckTarget(ctx context.Context, eventID string) (postgres.RecheckTarget, error)
	TransferClaims(ctx context.Context, network, txHash string) ([]postgres.TransferClaim, error)
	RecordRecheck(ctx context.Context, r postgres.Recheck, reopen bool) (postgres.Recheck, error)
}

// Rechecker asks the chain again about a failed deposit on an operator's
// request (POST /admin/events/{id}/recheck, settlectl events recheck).
type Rechecker struct {
	gate  *Gate
	store RecheckStore
}

// NewRechecker builds a Rechecker on a gate (see Open).
func NewRechecker(gate *Gate, store RecheckStore) *Rechecker {
	return &Rechecker{gate: gate, store: store}
}

// HasRPC tells whether a network's chain can be asked (see Gate.HasRPC).
func (r *Rechecker) HasRPC(network string) bool { return r.gate.HasRPC(network) }

// Recheck asks the chain about a deposit that ended failed with an outcome
// of payment.RecheckOutcomes, or that was credited and then compensated
// for a reorg. If the chain now shows its transfer final under the policy
// and unclaimed by another event, a failed deposit is reopened and the
// ledger credits it through the normal path (its transfer claim there is
// the last word), and a compensated one is watched again and given back
// once its block is finalized; otherwise it stays as it is and the answer
// says what the chain shows. Every recheck is recorded with
// who asked. The chain is asked with no row locked; the reopen is guarded
// by the status read before, so two rechecks at once reopen once.
//
// An event that is not such a deposit answers not_applicable without
// asking the chain, so a second recheck of a reopened deposit does
// nothing. When the chain cannot be asked the recheck is recorded and the
// error (payment.ErrUnavailable) returned with it.
func (r *Rechecker) Recheck(ctx context.Context, eventID, who string) (postgres.Recheck, error) {
	target, err := r.store.RecheckTarget(ctx, eventID)
	if err != nil {
		return postgres.Recheck{}, err
	}
	record := postgres.Recheck{EventID: eventID, RequestedBy: who, ChainState: ChainNotAsked, Result: postgres.RecheckNotApplicable}
	if why := notRecheckable(target); why != "" {
		record.Detail = why
		return r.store.RecordRecheck(ctx, record, false)
	}
	asked := target.Event
	if _, isLog := payment.LogIndex(asked.TransferIndex); isLog && target.ChainState == "reorged" {
		// Compensated: its transaction may be mined again in another
		// block, where a log index names another log. Any Transfer log
		// of it that pays the deposit will do, as for the reorg watch.
		asked.TransferIndex = ""
	}
	verdict, err := r.gate.Verdict(ctx, asked, target.ToAddress)
	switch {
	case errors.Is(err, payment.ErrUnavailable):
		record.ChainState, record.Result, record.Detail = ChainUnavailable, postgres.RecheckUnchanged, "the chain cannot be asked: "+err.Error()
		recorded, recordErr := r.store.RecordRecheck(ctx, record, false)
		if recordErr != nil {
			return postgres.Recheck{}, recordErr
		}
		return recorded, err
	case errors.Is(err, payment.ErrInvalid):
		record.Detail = "the chain cannot be asked about it: " + err.Error()
		return r.store.RecordRecheck(ctx, record, false)
	case err != nil:
		return postgres.Recheck{}, err
	}
	record.ChainState, record.Result, record.Detail = string(verdict.State), postgres.RecheckUnchanged, verdict.Reason
	if verdict.State == chain.Mismatch && strings.HasPrefix(eventID, payment.TransferEventIDPrefix) && verdict.BlockNumber > 0 {
		// A recheck keeps the stored content; the chain's own report of
		// the transfer replaces it (postgres.SupersedeDeposit).
		record.Detail += fmt.Sprintf("; a rescan of block %d supersedes the stored content with the chain's", verdict.BlockNumber)
	}
	if verdict.State != chain.Credit {
		return r.store.RecordRecheck(ctx, record, false)
	}
	holder, err := r.claimed(ctx, target.Event, verdict.Transfers)
	if err != nil {
		return postgres.Recheck{}, err
	}
	if holder != "" {
		record.Detail = "the chain shows the transfer final, but it is credited to event " + holder
		return r.store.RecordRecheck(ctx, record, false)
	}
	record.Detail = fmt.Sprintf("the chain shows the transfer final in block %d (%s)", verdict.BlockNumber, verdict.Reason)
	return r.store.RecordRecheck(ctx, record, true)
}

// notRecheckable says why an event is no deposit a recheck may reverse,
// or "" when it is one.
func notRecheckable(t postgres.RecheckTarget) string {
	switch {
	case !t.Event.Type.Credit():
		return fmt.Sprintf("event is a %s, not a deposit", t.Event.Type)
	case t.Event.TxHash == "":
		return "the deposit names no transaction"
	case t.Status == payment.StatusConfirmed && t.ChainState == "reorged":
		// Credited, then compensated for a reorg: the chain may show it
		// again, and then it is given back.
		return ""
	case t.Status != payment.StatusFailed:
		return fmt.Sprintf("the deposit is %s", t.Status)
	case !slices.Contains(payment.RecheckOutcomes, t.Outcome):
		return fmt.Sprintf("the deposit failed with outcome %s, which the chain cannot reverse", t.Outcome)
	}
	return ""
}

// claimed names an event holding every candidate transfer, or "" when one
// is free. Unresolved claims (migration 0007) of the same asset hold one
// unnamed transfer each. The ledger decides again under its lock; this
// only spares a reopen that could end nowhere but duplicate_transfer.
func (r *Rechecker) claimed(ctx context.Context, e payment.Event, candidates []string) (string, error) {
	if len(candidates) == 0 {
		return "", nil
	}
	claims, err := r.store.TransferClaims(ctx, networkOf(e), e.TxHash)
	if err != nil {
		return "", err
	}
	held := map[string]string{}
	var unresolved []string
	for _, c := range claims {
		switch {
		case c.EventID == e.ID:
		case payment.Unresolved(c.Index):
			if c.Asset == e.Asset {
				unresolved = append(unresolved, c.EventID)
			}
		default:
			held[c.Index] = c.EventID
		}
	}
	free := 0
	var holders []string
	for _, index := range candidates {
		if holder, ok := held[index]; ok {
			holders = append(holders, holder)
			continue
		}
		free++
	}
	if free > len(unresolved) {
		return "", nil
	}
	return strings.Join(append(holders, unresolved...), ", "), nil
}

// OpenRechecker builds the recheck the api and settlectl run, on
// ETH_RPC_URL and the worker's DEPOSIT_FINALITY (see ReadSettings); nil
// without an RPC endpoint. The returned function releases the client.
func OpenRechecker(ctx context.Context, s Settings, d Deps, store RecheckStore) (*Rechecker, func(), error) {
	gate, closeGate, err := Open(ctx, s, d)
	if err != nil || gate == nil {
		return nil, closeGate, err
	}
	return NewRechecker(gate, store), closeGate, nil
}
