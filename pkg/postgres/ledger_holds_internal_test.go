package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func d(s string) decimal.Decimal { return decimal.RequireFromString(s) }

func TestCanDebitTakesOnlyFromAvailable(t *testing.T) {
	for _, c := range []struct {
		balance, held, amount string
		ok                    bool
	}{
		{"100", "0", "100", true},
		{"100", "0", "100.000000000000000001", false},
		{"100", "60", "40", true},
		{"100", "60", "40.5", false},
		{"100", "100", "0.000000000000000001", false},
		{"0", "0", "1", false},
	} {
		require.Equal(t, c.ok, canDebit(d(c.balance), d(c.held), d(c.amount)), "%+v", c)
	}
	require.Equal(t, "40", available(d("100"), d("60")).String())
}

func TestHoldRefusal(t *testing.T) {
	open := &holdRow{id: "h", user: 1, asset: "ETH", amount: d("10"), status: payment.HoldOpen}
	with := func(change func(*holdRow)) *holdRow {
		h := *open
		change(&h)
		return &h
	}
	post := payment.Event{ID: "p", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: d("10"), HoldID: "h"}
	for name, c := range map[string]struct {
		hold  *holdRow
		event func(*payment.Event)
		want  payment.Outcome
	}{
		"open, own, same amount":  {hold: open, want: ""},
		"amount spelled 10.0":     {hold: open, event: func(e *payment.Event) { e.Amount = d("10.0") }, want: ""},
		"no such hold":            {hold: nil, want: payment.OutcomeUnknownHold},
		"another user's":          {hold: with(func(h *holdRow) { h.user = 2 }), want: payment.OutcomeUnknownHold},
		"another user's, closed":  {hold: with(func(h *holdRow) { h.user, h.status = 2, payment.HoldPosted }), want: payment.OutcomeUnknownHold},
		"another asset":           {hold: with(func(h *holdRow) { h.asset = "USDC" }), want: payment.OutcomeUnknownHold},
		"posted":                  {hold: with(func(h *holdRow) { h.status = payment.HoldPosted }), want: payment.OutcomeHoldClosed},
		"voided":                  {hold: with(func(h *holdRow) { h.status = payment.HoldVoided }), want: payment.OutcomeHoldClosed},
		"closed and other amount": {hold: with(func(h *holdRow) { h.status = payment.HoldVoided }), event: func(e *payment.Event) { e.Amount = d("9") }, want: payment.OutcomeHoldClosed},
		"other amount":            {hold: open, event: func(e *payment.Event) { e.Amount = d("9") }, want: payment.OutcomeMismatch},
	} {
		e := post
		if c.event != nil {
			c.event(&e)
		}
		require.Equal(t, c.want, holdRefusal(e, c.hold), name)
	}
}

func TestHoldMaySettle(t *testing.T) {
	for status, want := range map[payment.Status]bool{
		payment.StatusPending: true, payment.StatusEnqueued: true, payment.StatusAwaitingFinality: true,
		payment.StatusConfirmed: true, payment.StatusFailed: false,
	} {
		require.Equal(t, want, holdMaySettle(status, true), status)
	}
	require.False(t, holdMaySettle("", false), "no hold event at all")
}

// planned is one event of a table test of planBatch.
func planned(id string, typ payment.EventType, user int64, amount, holdID string, at int) claimedEvent {
	return claimedEvent{
		event:     payment.Event{ID: id, Type: typ, UserID: user, Asset: "ETH", Amount: d(amount), HoldID: holdID},
		createdAt: time.Unix(int64(at), 0), key: payment.IdempotencyKey(id, typ), item: at,
		holdID: holdID, holdNetwork: "ETH_MAINNET", network: "ETH_MAINNET", native: true,
	}
}

func TestPlanHolds(t *testing.T) {
	k := balanceKey{1, "ETH"}
	type want struct {
		outcomes      map[string]payment.Outcome
		balance, held string
		journal       int
		opened        int
		resolved      []holdResolution
		retry         []int
		notifications []string
	}
	existing := func(status payment.HoldStatus) map[string]*holdRow {
		return map[string]*holdRow{"h0": {id: "h0", user: 1, asset: "ETH", amount: d("30"), status: status, network: "ETH_MAINNET"}}
	}
	for name, c := range map[string]struct {
		events  []claimedEvent
		balance string
		held    string
		holds   map[string]*holdRow
		hevents map[string]payment.Status
		want    want
	}{
		"holds until available runs out": {
			events:  []claimedEvent{planned("h1", payment.WithdrawalHold, 1, "60", "", 1), planned("h2", payment.WithdrawalHold, 1, "50", "", 2), planned("h3", payment.WithdrawalHold, 1, "40", "", 3)},
			balance: "100",
			want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "h2": payment.OutcomeInsufficientFunds, "h3": payment.OutcomeHeld},
				balance: "100", held: "100", opened: 2, notifications: []string{NotifyInsufficientFunds}},
		},
		"withdrawal behind a hold": {
			events:  []claimedEvent{planned("w1", payment.Withdrawal, 1, "80", "", 2)},
			balance: "100", held: "30", holds: existing(payment.HoldOpen),
			want: want{outcomes: map[string]payment.Outcome{"w1": payment.OutcomeInsufficientFunds}, balance: "100", held: "30", notifications: []string{NotifyInsufficientFunds}},
		},
		"post of an open hold": {
			events:  []claimedEvent{planned("p1", payment.WithdrawalPost, 1, "30", "h0", 1)},
			balance: "100", held: "30", holds: existing(payment.HoldOpen), hevents: map[string]payment.Status{"h0": payment.StatusConfirmed},
			want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, balance: "70", held: "0", journal: 1,
				resolved: []holdResolution{{holdID: "h0", status: payment.HoldPosted, by: "p1"}}, notifications: []string{NotifyWithdrawalPosted}},
		},
		"void, then post, in one batch": {
			events:  []claimedEvent{planned("v1", payment.WithdrawalVoid, 1, "30", "h0", 1), planned("p1", payment.WithdrawalPost, 1, "30", "h0", 2)},
			balance: "100", held: "30", holds: existing(payment.HoldOpen),
			want: want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeSuccess, "p1": payment.OutcomeHoldClosed}, balance: "100", held: "0",
				resolved: []holdResolution{{holdID: "h0", status: payment.HoldVoided, by: "v1"}}, notifications: []string{NotifyHoldVoided}},
		},
		"post of a posted hold": {
			events:  []claimedEvent{planned("p2", payment.WithdrawalPost, 1, "30", "h0", 1)},
			balance: "70", holds: existing(payment.HoldPosted),
			want: want{outcomes: map[string]payment.Outcome{"p2": payment.OutcomeHoldClosed}, balance: "70", held: "0"},
		},
		"post of another user's hold": {
			events:  []claimedEvent{planned("p1", payment.WithdrawalPost, 2, "30", "h0", 1)},
			balance: "100", held: "30", holds: existing(payment.HoldOpen),
			want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balance: "100", held: "30"},
		},
		"post of a hold refused for insufficient funds": {
			events:  []claimedEvent{planned("p1", payment.WithdrawalPost, 1, "30", "h9", 1)},
			balance: "100", hevents: map[string]payment.Status{"h9": payment.StatusFailed},
			want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balance: "100", held: "0"},
		},
		"post of a hold not yet settled waits": {
			events:  []claimedEvent{planned("p1", payment.WithdrawalPost, 1, "30", "h9", 1)},
			balance: "100", hevents: map[string]payment.Status{"h9": payment.StatusEnqueued},
			want: want{outcomes: map[string]payment.Outcome{"p1": ""}, balance: "100", held: "0", retry: []int{1}},
		},
		"hold and its post in one batch": {
			events:  []claimedEvent{planned("h1", payment.WithdrawalHold, 1, "25", "", 1), planned("p1", payment.WithdrawalPost, 1, "25", "h1", 2)},
			balance: "100", hevents: map[string]payment.Status{"h1": payment.StatusEnqueued},
			want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "p1": payment.OutcomeSuccess}, balance: "75", held: "0", journal: 1, opened: 1,
				resolved: []holdResolution{{holdID: "h1", status: payment.HoldPosted, by: "p1"}}, notifications: []string{NotifyWithdrawalPosted}},
		},
		"post naming another amount": {
			events:  []claimedEvent{planned("p1", payment.WithdrawalPost, 1, "29", "h0", 1)},
			balance: "100", held: "30", holds: existing(payment.HoldOpen),
			want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeMismatch}, balance: "100", held: "30"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			balances := map[balanceKey]decimal.Decimal{k: d(c.balance), {2, "ETH"}: d("0")}
			held := map[balanceKey]decimal.Decimal{}
			if c.held != "" {
				held[k] = d(c.held)
			}
			p := planBatch(c.events, map[int]*ChainEvidence{}, map[string]payment.Outcome{}, balances, nil,
				&holdBook{held: held, holds: c.holds, events: c.hevents})
			got := map[string]payment.Outcome{}
			for _, e := range c.events {
				if r, ok := p.results[e.item]; ok {
					got[e.event.ID] = r.Outcome
				}
			}
			require.Equal(t, c.want.outcomes, got)
			require.Equal(t, c.want.balance, balances[k].String())
			require.Equal(t, c.want.held, p.book.held[k].String())
			require.Len(t, p.journal, c.want.journal)
			for _, j := range p.journal {
				require.Equal(t, payment.Withdrawal, j.eventType, "a post journals as a withdrawal")
				require.True(t, j.amount.IsNegative())
			}
			require.Len(t, p.newHolds, c.want.opened)
			require.Equal(t, c.want.resolved, p.resolutions)
			require.Empty(t, p.retry, "a waiting post does not roll the batch back")
			var retried []int
			for item, r := range p.results {
				if r.Kind == Retry {
					require.ErrorIs(t, r.Err, payment.ErrUnavailable)
					retried = append(retried, item)
				}
			}
			require.ElementsMatch(t, c.want.retry, retried)
			var kinds []string
			for _, n := range p.notification {
				kinds = append(kinds, n.kind)
			}
			require.Equal(t, c.want.notifications, kinds)
			// Confirmed holds say held; no confirm is ever left without
			// an outcome.
			for _, cr := range p.confirms {
				require.True(t, cr.outcome.Confirms(), cr.id)
			}
		})
	}
}

func TestRetryEverythingAfterTheLastRound(t *testing.T) {
	waiting := payment.Unavailable("ledger hold", errors.New("hold h has not settled yet"))
	// Three items, the second delivered twice (alias 1 twice).
	out := retryEverything(3, []int{0, 1, 1, 2}, map[int]error{1: waiting})
	require.Len(t, out, 4)
	for i, r := range out {
		require.Equal(t, Retry, r.Kind, i)
	}
	require.Same(t, waiting, out[1].Err)
	require.Same(t, waiting, out[2].Err)
	require.ErrorIs(t, out[0].Err, payment.ErrRetryable)
	require.NotErrorIs(t, out[0].Err, payment.ErrUnavailable, "a rolled-back item spends its budget as any transient error")
	require.ErrorIs(t, out[3].Err, payment.ErrRetryable)
}
