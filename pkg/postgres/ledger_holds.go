package postgres

import (
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// Notification kinds of holds.
const (
	NotifyWithdrawalPosted = "withdrawal_posted"
	NotifyHoldVoided       = "hold_voided"
)

// holdRow is a holds row as the ledger plans with it; status changes as
// the batch resolves it.
type holdRow struct {
	id        string
	user      int64
	asset     string
	amount    decimal.Decimal
	status    payment.HoldStatus
	network   string
	toAddress string
}

// holdBook is what the planner knows of holds: the held amount of every
// locked balance row, the holds rows this batch's posts and voids name
// (locked), and the statuses of those holds' events.
type holdBook struct {
	held   map[balanceKey]decimal.Decimal
	holds  map[string]*holdRow
	events map[string]payment.Status
}

func (b *holdBook) withDefaults() *holdBook {
	if b == nil {
		b = &holdBook{}
	}
	if b.held == nil {
		b.held = map[balanceKey]decimal.Decimal{}
	}
	if b.holds == nil {
		b.holds = map[string]*holdRow{}
	}
	if b.events == nil {
		b.events = map[string]payment.Status{}
	}
	return b
}

// holdResolution is a planned open -> posted | voided move.
type holdResolution struct {
	holdID string
	status payment.HoldStatus
	by     string
}

// The hold rules, each a pure function of what the batch read.

// available is what a debit may take: the balance less its open holds.
func available(balance, held decimal.Decimal) decimal.Decimal { return balance.Sub(held) }

// canDebit reports whether amount fits in the available balance.
func canDebit(balance, held, amount decimal.Decimal) bool {
	return !available(balance, held).LessThan(amount)
}

// holdRefusal says why event e (a post or void) may not resolve hold h,
// or "" when it may. Another user's hold is unknown to e's sender, closed
// or not, so nothing about it leaks.
func holdRefusal(e payment.Event, h *holdRow) payment.Outcome {
	switch {
	case h == nil || h.user != e.UserID || h.asset != e.Asset:
		return payment.OutcomeUnknownHold
	case h.status.Resolved():
		return payment.OutcomeHoldClosed
	case !h.amount.Equal(e.Amount):
		return payment.OutcomeMismatch
	}
	return ""
}

// holdMaySettle reports whether a hold without a row may still get one:
// its event was accepted and has not failed. (One seen confirmed without
// its row can only be a commit between this batch's two reads.)
func holdMaySettle(status payment.Status, seen bool) bool {
	return seen && status != payment.StatusFailed
}

// reserve plans a withdrawal_hold: the amount leaves available, not the
// balance, and a holds row opens.
func (p *batchPlan) reserve(c claimedEvent, k balanceKey, balance decimal.Decimal, result *LedgerResult) {
	e := c.event
	held := p.book.held[k]
	if !canDebit(balance, held, e.Amount) {
		p.refuse(c, result, payment.OutcomeInsufficientFunds, "")
		p.notify(c, NotifyInsufficientFunds, available(balance, held))
		return
	}
	p.holdDelta(k, e.Amount)
	h := &holdRow{id: e.ID, user: e.UserID, asset: e.Asset, amount: e.Amount, status: payment.HoldOpen, network: c.holdNetwork, toAddress: c.toAddress}
	p.book.holds[e.ID] = h
	p.newHolds = append(p.newHolds, *h)
	p.outcomes[c.key] = payment.OutcomeHeld
	p.confirms = append(p.confirms, confirmRow{id: e.ID, outcome: payment.OutcomeHeld})
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeHeld
}

// resolve plans a withdrawal_post (the hold becomes a journal debit) or a
// withdrawal_void (the hold is released). It reports false when the item
// must wait for its hold's event to settle: its result is then Retry, and
// the rest of the batch commits without it (the post's row stays enqueued,
// and nothing planned for the others depends on it).
func (p *batchPlan) resolve(c claimedEvent, k balanceKey, balance decimal.Decimal, chain *ChainEvidence, result *LedgerResult) bool {
	e := c.event
	h := p.book.holds[c.holdID]
	if e.Amount.IsZero() {
		// Accepted while its hold id named no hold: unknown for good, even
		// if a hold of that id arrives later.
		h = nil
	} else if h == nil {
		if status, seen := p.book.events[c.holdID]; holdMaySettle(status, seen) {
			// Waiting on its hold is not the post's failure: like an
			// outage it is retried without spending the retry budget (a
			// backlog could otherwise dead-letter a good post), for as long
			// as the hold's event lives, which stale recovery bounds.
			p.results[c.item] = LedgerResult{Kind: Retry, Status: payment.StatusEnqueued, CreatedAt: c.createdAt,
				Err: payment.Unavailable("ledger hold", fmt.Errorf("hold %s of %s has not settled yet", c.holdID, e.ID))}
			return false
		}
	}
	if why := holdRefusal(e, h); why != "" {
		p.refuse(c, result, why, fmt.Sprintf("hold %s: %s", c.holdID, why))
		return true
	}
	to, _ := payment.HoldResolution(e.Type)
	h.status = to
	p.resolutions = append(p.resolutions, holdResolution{holdID: h.id, status: to, by: e.ID})
	p.holdDelta(k, h.amount.Neg())
	kind, after := NotifyHoldVoided, balance
	if e.Type == payment.WithdrawalPost {
		after = balance.Sub(h.amount)
		p.post(c, h.amount.Neg(), after, p.balances)
		kind = NotifyWithdrawalPosted
	}
	p.outcomes[c.key] = payment.OutcomeSuccess
	// A post's transaction is the payment out: its block is recorded, but
	// it is no deposit for the reorg watcher to follow.
	p.confirms = append(p.confirms, confirmRow{id: e.ID, chain: chain, outcome: payment.OutcomeSuccess, unwatched: true})
	p.notify(c, kind, after)
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
	return true
}

// refuse ends an event failed with a business outcome; no money moves.
func (p *batchPlan) refuse(c claimedEvent, result *LedgerResult, outcome payment.Outcome, reason string) {
	p.outcomes[c.key] = outcome
	p.fails = append(p.fails, failRow{id: c.event.ID, outcome: outcome, err: reason})
	result.Status, result.Outcome = payment.StatusFailed, outcome
}

func (p *batchPlan) holdDelta(k balanceKey, signed decimal.Decimal) {
	p.book.held[k] = p.book.held[k].Add(signed)
	p.heldDeltas[k] = p.heldDeltas[k].Add(signed)
}

func (p *batchPlan) queueOpenHolds(batch *pgx.Batch) {
	n := len(p.newHolds)
	ids, users, assets, amounts, networks, tos := make([]string, n), make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, h := range p.newHolds {
		ids[i], users[i], assets[i], amounts[i], networks[i], tos[i] = h.id, h.user, h.asset, h.amount.String(), h.network, h.toAddress
	}
	batch.Queue(q("ledger_open_holds").text, ids, users, assets, amounts, networks, tos)
}

func (p *batchPlan) queueResolveHolds(batch *pgx.Batch) {
	sort.Slice(p.resolutions, func(i, j int) bool { return p.resolutions[i].holdID < p.resolutions[j].holdID })
	n := len(p.resolutions)
	ids, statuses, by := make([]string, n), make([]string, n), make([]string, n)
	for i, r := range p.resolutions {
		ids[i], statuses[i], by[i] = r.holdID, string(r.status), r.by
	}
	batch.Queue(q("ledger_resolve_holds").text, ids, statuses, by)
}

func readHoldEvents(br pgx.BatchResults) (map[string]payment.Status, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]payment.Status{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return nil, err
		}
		out[id] = payment.Status(status)
	}
	return out, rows.Err()
}

func readHolds(br pgx.BatchResults) (map[string]*holdRow, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*holdRow{}
	for rows.Next() {
		var h holdRow
		var amount, status string
		if err := rows.Scan(&h.id, &h.user, &h.asset, &amount, &status, &h.network, &h.toAddress); err != nil {
			return nil, err
		}
		h.amount, h.status = decimal.RequireFromString(amount), payment.HoldStatus(status)
		out[h.id] = &h
	}
	return out, rows.Err()
}
