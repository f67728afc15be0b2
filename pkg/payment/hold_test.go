package payment_test

import (
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestHoldTransitions(t *testing.T) {
	require.True(t, payment.HoldOpen.CanTransition(payment.HoldPosted))
	require.True(t, payment.HoldOpen.CanTransition(payment.HoldVoided))
	for _, from := range []payment.HoldStatus{payment.HoldPosted, payment.HoldVoided} {
		require.True(t, from.Resolved())
		for _, to := range payment.HoldStatuses {
			require.False(t, from.CanTransition(to), "%s resolves once", from)
		}
	}
	require.False(t, payment.HoldOpen.CanTransition(payment.HoldOpen))
	to, ok := payment.HoldResolution(payment.WithdrawalPost)
	require.True(t, ok)
	require.Equal(t, payment.HoldPosted, to)
	_, ok = payment.HoldResolution(payment.Withdrawal)
	require.False(t, ok)
}

func TestHoldFieldsInTheContentHash(t *testing.T) {
	base := payment.Content{Type: payment.WithdrawalPost, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("5"), HoldID: "h"}
	require.Equal(t, base.Hash(), base.Hash())
	for name, change := range map[string]func(*payment.Content){
		"hold":    func(c *payment.Content) { c.HoldID = "h2" },
		"network": func(c *payment.Content) { c.Network = "ETH_MAINNET" },
		"to":      func(c *payment.Content) { c.ToAddress = "0x01" },
		// The same text in another field is another content.
		"moved": func(c *payment.Content) { c.HoldID, c.TransferIndex = "", "h" },
	} {
		other := base
		change(&other)
		require.NotEqual(t, base.Hash(), other.Hash(), name)
	}
	upper, lower := base, base
	upper.ToAddress, lower.ToAddress = "0xAB", "0xab"
	require.Equal(t, upper.Hash(), lower.Hash())
	// An event without the new fields hashes as before they existed (the
	// value computed by the code before the hold fields).
	old := payment.Content{Type: payment.Deposit, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("5")}
	require.Equal(t, "65340b12", hex8(old.Hash()))
}

func hex8(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 8)
	for i := range 4 {
		out[2*i], out[2*i+1] = digits[b[i]>>4], digits[b[i]&15]
	}
	return string(out)
}
