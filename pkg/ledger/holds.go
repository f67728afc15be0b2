package ledger

import (
	"fmt"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// Hold is a holds row as the ledger plans with it; Status changes as the
// batch resolves it.
type Hold struct {
	ID        string
	User      int64
	Asset     string
	Amount    decimal.Decimal
	Status    payment.HoldStatus
	Network   string
	ToAddress string
}

// HoldResolution is a planned open -> posted | voided move.
type HoldResolution struct {
	HoldID string
	Status payment.HoldStatus
	By     string
}

// The hold rules, each a pure function of what the batch read.

// available is what a debit may take: the balance less its open holds.
func available(balance, held decimal.Decimal) decimal.Decimal { return balance.Sub(held) }

// canDebit reports whether amount fits in the available balance.
func canDebit(balance, held, amount decimal.Decimal) bool {
	return !available(balance, held).LessThan(amount)
}

// holdRefusal says why event e (a post or void) may not resolve hold h,
// or "" when it may, with a word on what differs. Another user's hold is
// unknown to e's sender, closed or not, so nothing about it leaks.
// network is e's (its own, or its asset's when it names none): a post is
// checked and its payout claimed there, so one on another network than
// its hold's would settle the hold with a payment on the wrong chain.
func holdRefusal(e payment.Event, network string, h *Hold) (payment.Outcome, string) {
	switch {
	case h == nil || h.User != e.UserID || h.Asset != e.Asset:
		return payment.OutcomeUnknownHold, ""
	case h.Status.Resolved():
		return payment.OutcomeHoldClosed, ""
	case !h.Amount.Equal(e.Amount):
		return payment.OutcomeMismatch, fmt.Sprintf("amount %s, the hold's %s", e.Amount, h.Amount)
	case e.Type == payment.WithdrawalPost && network != h.Network:
		return payment.OutcomeMismatch, fmt.Sprintf("post on %s, the hold on %s", network, h.Network)
	}
	return "", ""
}

// holdMaySettle reports whether a hold without a row may still get one:
// its event was accepted and has not failed. (One seen confirmed without
// its row can only be a commit between this batch's two reads.)
func holdMaySettle(status payment.Status, seen bool) bool {
	return seen && status != payment.StatusFailed
}

// reserve plans a withdrawal_hold: the amount leaves available, not the
// balance, and a holds row opens.
func (p *planner) reserve(c Claimed, k Account, balance decimal.Decimal, result *Result) {
	e := c.Event
	held := p.held[k]
	if !canDebit(balance, held, e.Amount) {
		p.refuse(c, result, payment.OutcomeInsufficientFunds, "")
		p.notify(c, k, NotifyInsufficientFunds, balance)
		// Its posts later in the batch know it failed: unknown_hold now,
		// not a wait for what this transaction decides.
		p.holdEvents[e.ID] = payment.StatusFailed
		return
	}
	p.holdDelta(k, e.Amount)
	h := &Hold{ID: e.ID, User: e.UserID, Asset: e.Asset, Amount: e.Amount, Status: payment.HoldOpen, Network: c.HoldNetwork, ToAddress: c.ToAddress}
	p.holds[e.ID] = h
	p.w.OpenHolds = append(p.w.OpenHolds, *h)
	p.w.Outcomes[c.Key] = payment.OutcomeHeld
	p.w.Confirms = append(p.w.Confirms, Confirm{ID: e.ID, Outcome: payment.OutcomeHeld})
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeHeld
}

// resolve plans a withdrawal_post (the hold becomes a journal debit) or a
// withdrawal_void (the hold is released). It reports false when the item
// must wait for its hold's event to settle: its result is then Retry, and
// the rest of the batch commits without it (the post's row stays enqueued,
// and nothing planned for the others depends on it).
func (p *planner) resolve(c Claimed, k Account, balance decimal.Decimal, chain *ChainEvidence, result *Result) bool {
	e := c.Event
	if _, waiting := p.pulled[c.HoldID]; waiting && p.holds[c.HoldID] == nil {
		// Its hold sorted after it (accepted in the same instant): apply
		// the hold first, as its own task would have.
		p.pull(c.HoldID)
	}
	h := p.holds[c.HoldID]
	if e.Amount.IsZero() {
		// Accepted while its hold id named no hold: unknown for good, even
		// if a hold of that id arrives later.
		h = nil
	} else if h == nil {
		if status, seen := p.holdEvents[c.HoldID]; holdMaySettle(status, seen) {
			// Waiting on its hold is not the post's failure: like an
			// outage it is retried without spending the retry budget (a
			// backlog could otherwise dead-letter a good post), for as long
			// as the hold's event lives, which stale recovery bounds.
			p.w.Results[c.Item] = Result{Kind: Retry, Status: payment.StatusEnqueued, CreatedAt: c.CreatedAt,
				Err: payment.Unavailable("ledger hold", fmt.Errorf("hold %s of %s has not settled yet", c.HoldID, e.ID))}
			return false
		}
	}
	if why, detail := holdRefusal(e, c.Network, h); why != "" {
		reason := fmt.Sprintf("hold %s: %s", c.HoldID, why)
		if detail != "" {
			reason += " (" + detail + ")"
		}
		p.refuse(c, result, why, reason)
		return true
	}
	if e.Type == payment.WithdrawalPost && !p.claimPayout(c, chain) {
		// Every transfer of the transaction that pays this hold settles
		// another post already: the money left once.
		p.refuse(c, result, payment.OutcomeDuplicateTransfer,
			fmt.Sprintf("the transfer of %s that pays hold %s already settles another post", e.TxHash, c.HoldID))
		return true
	}
	to, _ := payment.HoldResolution(e.Type)
	h.Status = to
	p.w.Resolutions = append(p.w.Resolutions, HoldResolution{HoldID: h.ID, Status: to, By: e.ID})
	p.holdDelta(k, h.Amount.Neg())
	kind, after := NotifyHoldVoided, balance
	if e.Type == payment.WithdrawalPost {
		after = balance.Sub(h.Amount)
		p.post(c, h.Amount.Neg(), after)
		kind = NotifyWithdrawalPosted
	}
	p.w.Outcomes[c.Key] = payment.OutcomeSuccess
	// A post's transaction confirmed before finality is watched like a
	// deposit's: the watch only reports a payout that leaves the chain
	// (finality.Gate.payoutReorged), it moves no money.
	p.w.Confirms = append(p.w.Confirms, Confirm{ID: e.ID, Chain: chain, Outcome: payment.OutcomeSuccess})
	p.notify(c, k, kind, after)
	result.Status, result.Outcome = payment.StatusConfirmed, payment.OutcomeSuccess
	return true
}

// pull applies a pulled hold event once, as its task would: it reserves
// or is refused for insufficient funds, and its posts then see it
// settled. One that the batch cannot apply here (its account not locked,
// an idempotency record already written, not a hold) is left to its own
// task, untouched, and its posts wait for it as before.
func (p *planner) pull(id string) {
	c, ok := p.pulled[id]
	if !ok {
		return
	}
	delete(p.pulled, id)
	e := c.Event
	k := Account{e.UserID, e.Asset}
	balance, locked := p.balances[k]
	if _, recorded := p.replays[c.Key]; !locked || recorded || e.Type != payment.WithdrawalHold {
		return
	}
	result := Result{Kind: Applied, CreatedAt: c.CreatedAt, Event: e}
	p.w.KeyEvents[c.Key] = e.ID
	p.reserve(c, k, balance, &result)
	p.w.PulledResults[id] = result
}

// refuse ends an event failed with a business outcome; no money moves.
func (p *planner) refuse(c Claimed, result *Result, outcome payment.Outcome, reason string) {
	p.w.Outcomes[c.Key] = outcome
	p.w.Fails = append(p.w.Fails, Fail{ID: c.Event.ID, Outcome: outcome, Err: reason})
	result.Status, result.Outcome = payment.StatusFailed, outcome
}

func (p *planner) holdDelta(k Account, signed decimal.Decimal) {
	p.held[k] = p.held[k].Add(signed)
	p.w.HeldDeltas[k] = p.w.HeldDeltas[k].Add(signed)
}
