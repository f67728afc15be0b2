package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// RechecksListMax bounds the history Rechecks returns.
const RechecksListMax = 100

// RecheckResult is what a recheck did to its deposit.
type RecheckResult string

const (
	// RecheckReopened: the chain shows the transfer final and unclaimed;
	// the deposit went back to the outbox and the ledger credits it.
	RecheckReopened RecheckResult = "reopened"
	// RecheckUnchanged: the chain was asked and does not show the
	// transfer final and unclaimed; the deposit stays failed.
	RecheckUnchanged RecheckResult = "unchanged"
	// RecheckNotApplicable: the event is not a failed deposit a recheck
	// may reverse (confirmed, in flight, another outcome, no tx_hash).
	RecheckNotApplicable RecheckResult = "not_applicable"
)

// Recheck is one recorded recheck of a failed deposit.
type Recheck struct {
	ID          int64
	EventID     string
	RequestedBy string
	// ChainState is what the chain showed: a verdict state (credit, wait,
	// reverted, mismatch), "unavailable", or "not_asked".
	ChainState string
	Result     RecheckResult
	Detail     string
	CreatedAt  time.Time
	// Status is the event's status once the recheck is recorded.
	Status payment.Status
}

// RecheckView is a recheck as POST /admin/events/{event_id}/recheck
// answers it (with the request's trace id) and settlectl's --json prints
// it. A recheck of the history has no status: the event's status then is
// not kept with it.
type RecheckView struct {
	EventID     string    `json:"event_id"`
	Result      string    `json:"result"`
	Status      string    `json:"status,omitempty"`
	ChainState  string    `json:"chain_state"`
	Detail      string    `json:"detail"`
	RecheckID   int64     `json:"recheck_id"`
	RequestedBy string    `json:"requested_by"`
	CheckedAt   time.Time `json:"checked_at"`
}

// View is r as RecheckView, its time in UTC.
func (r Recheck) View() RecheckView {
	return RecheckView{EventID: r.EventID, Result: string(r.Result), Status: string(r.Status), ChainState: r.ChainState,
		Detail: r.Detail, RecheckID: r.ID, RequestedBy: r.RequestedBy, CheckedAt: r.CreatedAt.UTC()}
}

// RecheckTarget is a stored event as a recheck asks the chain about it.
type RecheckTarget struct {
	Event     payment.Event // with its TransferIndex and Generation
	Status    payment.Status
	Outcome   payment.Outcome // "" while not terminal
	Error     string
	ToAddress string
	// ChainState is "reorged" for a credited deposit compensated for a
	// reorg (see ReturnDeposit).
	ChainState string
}

// RecheckTarget reads one event; payment.ErrNotFound if there is none.
func (db *DB) RecheckTarget(ctx context.Context, eventID string) (RecheckTarget, error) {
	stmt := q("recheck_target")
	var r RecheckTarget
	var eventType, amount, status, outcome string
	var generation int32
	err := db.pool.QueryRow(ctx, stmt.text, eventID).Scan(&r.Event.ID, &eventType, &r.Event.UserID, &r.Event.Asset, &amount,
		&status, &outcome, &r.Error, &r.Event.TxHash, &r.Event.TransferIndex, &r.ToAddress, &r.Event.TraceID, &generation, &r.Event.Network, &r.ChainState)
	if errors.Is(err, pgx.ErrNoRows) {
		return RecheckTarget{}, fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
	}
	if err != nil {
		return RecheckTarget{}, classify(stmt.name, err)
	}
	r.Event.Type, r.Event.Amount, r.Event.Generation = payment.EventType(eventType), decimal.RequireFromString(amount), int(generation)
	r.Status, r.Outcome = payment.Status(status), payment.Outcome(outcome)
	return r, nil
}

// TransferClaim is one chain_transfers row: the event holding a transfer.
type TransferClaim struct {
	Index   string // a transfer index, or an unresolved claim (payment.Unresolved)
	EventID string
	Asset   string
}

// TransferClaims lists the claimed transfers of one transaction.
func (db *DB) TransferClaims(ctx context.Context, network, txHash string) ([]TransferClaim, error) {
	stmt := q("transfer_claims")
	rows, err := db.pool.Query(ctx, stmt.text, network, txHash)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TransferClaim, error) {
		var c TransferClaim
		return c, row.Scan(&c.Index, &c.EventID, &c.Asset)
	})
	return out, classify(stmt.name, err)
}

// RecordRecheck records a recheck and, when reopen is set, reopens its
// failed deposit (ReopenDeposit with payment.RecheckOutcomes) in the same
// transaction, or watches a compensated one again to give it back
// (ReturnDeposit). A reopen that finds the deposit no longer failed with
// such an outcome, or compensated (a concurrent recheck won), is recorded
// as not_applicable.
// r.Result is ignored when reopen is set; the answer carries the id, the
// time, the result and the event's status after.
func (db *DB) RecordRecheck(ctx context.Context, r Recheck, reopen bool) (Recheck, error) {
	if r.RequestedBy == "" {
		return Recheck{}, payment.Invalid("a recheck needs the operator's name")
	}
	tx, err := db.begin(ctx)
	if err != nil {
		return Recheck{}, classify("record recheck", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if reopen {
		reopened, err := reopenDeposit(ctx, tx, r.EventID, payment.RecheckOutcomes, "recheck by "+r.RequestedBy+": "+r.Detail)
		if err != nil {
			return Recheck{}, err
		}
		r.Result = RecheckReopened
		if !reopened {
			back, err := returnDeposit(ctx, tx, r.EventID, payment.Transfer{}, true, "recheck by "+r.RequestedBy+": "+r.Detail)
			switch {
			case err != nil:
				return Recheck{}, err
			case back == WatchedAgain:
				r.Detail += "; the deposit was compensated for a reorg: watched again, and given back once its block is finalized"
			case back == CyclesExhausted:
				r.Result = RecheckNotApplicable
				r.Detail = fmt.Sprintf("the deposit was compensated and given back %d times, the most settle does; it stays compensated for a human to decide; ", payment.ReorgCyclesMax-1) + r.Detail
			default:
				r.Result = RecheckNotApplicable
				r.Detail = "the event moved on while the chain was asked; " + r.Detail
			}
		}
	}
	stmt := q("insert_recheck")
	if err := tx.QueryRow(ctx, stmt.text, r.EventID, r.RequestedBy, r.ChainState, string(r.Result), r.Detail).Scan(&r.ID, &r.CreatedAt); err != nil {
		return Recheck{}, classify(stmt.name, err)
	}
	states, err := eventStates(ctx, tx, []string{r.EventID})
	if err != nil {
		return Recheck{}, err
	}
	r.Status = states[r.EventID].Status
	if err := tx.Commit(ctx); err != nil {
		return Recheck{}, classify("record recheck commit", err)
	}
	return r, nil
}

// Rechecks lists the recorded rechecks of an event, oldest first, at most
// RechecksListMax.
func (db *DB) Rechecks(ctx context.Context, eventID string) ([]Recheck, error) {
	stmt := q("rechecks_of_event")
	rows, err := db.pool.Query(ctx, stmt.text, eventID, RechecksListMax)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Recheck, error) {
		var r Recheck
		var result string
		err := row.Scan(&r.ID, &r.EventID, &r.RequestedBy, &r.ChainState, &result, &r.Detail, &r.CreatedAt)
		r.Result = RecheckResult(result)
		return r, err
	})
	return out, classify(stmt.name, err)
}

// LastRecheckID is the id of the event's newest recheck (0: none).
func (db *DB) LastRecheckID(ctx context.Context, eventID string) (int64, error) {
	stmt := q("last_recheck_id")
	var id int64
	err := db.pool.QueryRow(ctx, stmt.text, eventID).Scan(&id)
	return id, classify(stmt.name, err)
}

// RecheckAfter is the event's first recheck by who recorded after id
// after, with the event's status now; false while there is none.
func (db *DB) RecheckAfter(ctx context.Context, eventID string, after int64, who string) (Recheck, bool, error) {
	stmt := q("recheck_after")
	var r Recheck
	var result, status string
	err := db.pool.QueryRow(ctx, stmt.text, eventID, after, who).Scan(&r.ID, &r.EventID, &r.RequestedBy, &r.ChainState, &result, &r.Detail, &r.CreatedAt, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return Recheck{}, false, nil
	}
	if err != nil {
		return Recheck{}, false, classify(stmt.name, err)
	}
	r.Result, r.Status = RecheckResult(result), payment.Status(status)
	return r, true, nil
}
