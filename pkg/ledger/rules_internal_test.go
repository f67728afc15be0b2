package ledger

import (
	"testing"

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
	open := &Hold{ID: "h", User: 1, Asset: "ETH", Amount: d("10"), Status: payment.HoldOpen, Network: "ETH_MAINNET"}
	with := func(change func(*Hold)) *Hold {
		h := *open
		change(&h)
		return &h
	}
	post := payment.Event{ID: "p", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: d("10"), HoldID: "h"}
	void := post
	void.ID, void.Type = "v", payment.WithdrawalVoid
	for name, c := range map[string]struct {
		hold    *Hold
		event   func(*payment.Event)
		network string // the event's; the hold's when empty
		want    payment.Outcome
	}{
		"open, own, same amount":        {hold: open, want: ""},
		"amount spelled 10.0":           {hold: open, event: func(e *payment.Event) { e.Amount = d("10.0") }, want: ""},
		"no such hold":                  {hold: nil, want: payment.OutcomeUnknownHold},
		"another user's":                {hold: with(func(h *Hold) { h.User = 2 }), want: payment.OutcomeUnknownHold},
		"another user's, closed":        {hold: with(func(h *Hold) { h.User, h.Status = 2, payment.HoldPosted }), want: payment.OutcomeUnknownHold},
		"another asset":                 {hold: with(func(h *Hold) { h.Asset = "USDC" }), want: payment.OutcomeUnknownHold},
		"posted":                        {hold: with(func(h *Hold) { h.Status = payment.HoldPosted }), want: payment.OutcomeHoldClosed},
		"voided":                        {hold: with(func(h *Hold) { h.Status = payment.HoldVoided }), want: payment.OutcomeHoldClosed},
		"closed and other amount":       {hold: with(func(h *Hold) { h.Status = payment.HoldVoided }), event: func(e *payment.Event) { e.Amount = d("9") }, want: payment.OutcomeHoldClosed},
		"other amount":                  {hold: open, event: func(e *payment.Event) { e.Amount = d("9") }, want: payment.OutcomeMismatch},
		"other network":                 {hold: open, network: "BASE_MAINNET", want: payment.OutcomeMismatch},
		"closed and other network":      {hold: with(func(h *Hold) { h.Status = payment.HoldPosted }), network: "BASE_MAINNET", want: payment.OutcomeHoldClosed},
		"another user's, other network": {hold: with(func(h *Hold) { h.User = 2 }), network: "BASE_MAINNET", want: payment.OutcomeUnknownHold},
		// A void pays nothing out: where it says it is does not matter.
		"void, other network": {hold: open, event: func(e *payment.Event) { *e = void }, network: "BASE_MAINNET", want: ""},
	} {
		e := post
		if c.event != nil {
			c.event(&e)
		}
		network := c.network
		if network == "" && c.hold != nil {
			network = c.hold.Network
		}
		got, _ := holdRefusal(e, network, c.hold)
		require.Equal(t, c.want, got, name)
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
