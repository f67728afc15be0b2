package payment_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestIdempotencyKeyVectors(t *testing.T) {
	// The encoding, spelled out: 4-byte big-endian length + bytes, twice.
	want := sha256.Sum256([]byte("\x00\x00\x00\x03evt\x00\x00\x00\x07deposit"))
	require.Equal(t, hex.EncodeToString(want[:]), payment.IdempotencyKey("evt", payment.Deposit))
	require.Len(t, payment.IdempotencyKey("", ""), 64)

	collisions := [][2][2]string{
		{{"a\x00b", "c"}, {"a", "b\x00c"}}, // NUL separators collided
		{{"a::b", "c"}, {"a", "b::c"}},     // "::" joins collided
		{{"ab", "c"}, {"a", "bc"}},         // plain concatenation collides
		{{"", "ab"}, {"ab", ""}},
	}
	for _, pair := range collisions {
		left := payment.IdempotencyKey(pair[0][0], payment.EventType(pair[0][1]))
		right := payment.IdempotencyKey(pair[1][0], payment.EventType(pair[1][1]))
		require.NotEqual(t, left, right, "%q vs %q", pair[0], pair[1])
	}
}

func FuzzIdempotencyKeyInjective(f *testing.F) {
	f.Add("a\x00b", "c", "a", "b\x00c")
	f.Add("a::b", "c", "a", "b::c")
	f.Fuzz(func(t *testing.T, id1, type1, id2, type2 string) {
		k1 := payment.IdempotencyKey(id1, payment.EventType(type1))
		k2 := payment.IdempotencyKey(id2, payment.EventType(type2))
		if (id1 == id2 && type1 == type2) != (k1 == k2) {
			t.Fatalf("(%q,%q) and (%q,%q): keys %s %s", id1, type1, id2, type2, k1, k2)
		}
	})
}

func TestContentHashComparesAmountsNumerically(t *testing.T) {
	base := payment.Content{Type: payment.Deposit, UserID: 7, Asset: "ETH", Amount: decimal.RequireFromString("50")}
	same := base
	same.Amount = decimal.RequireFromString("50.000")
	require.Equal(t, base.Hash(), same.Hash())

	for name, change := range map[string]func(*payment.Content){
		"type":   func(c *payment.Content) { c.Type = payment.Airdrop },
		"user":   func(c *payment.Content) { c.UserID = 8 },
		"asset":  func(c *payment.Content) { c.Asset = "USDC" },
		"amount": func(c *payment.Content) { c.Amount = decimal.RequireFromString("50.000000000000000001") },
		"tx":     func(c *payment.Content) { c.TxHash = "0x01" },
	} {
		other := base
		change(&other)
		require.NotEqual(t, base.Hash(), other.Hash(), name)
	}
	upper := base
	upper.TxHash = "0xAB"
	lower := base
	lower.TxHash = "0xab"
	require.Equal(t, upper.Hash(), lower.Hash())
}

func TestTransitionTable(t *testing.T) {
	allowed := map[[2]payment.Status]bool{
		{payment.StatusPending, payment.StatusEnqueued}:          true,
		{payment.StatusPending, payment.StatusFailed}:            true,
		{payment.StatusEnqueued, payment.StatusProcessing}:       true,
		{payment.StatusEnqueued, payment.StatusFailed}:           true,
		{payment.StatusEnqueued, payment.StatusPending}:          true,
		{payment.StatusEnqueued, payment.StatusConfirmed}:        true,
		{payment.StatusEnqueued, payment.StatusAwaitingFinality}: true,
		{payment.StatusProcessing, payment.StatusConfirmed}:      true,
		{payment.StatusProcessing, payment.StatusFailed}:         true,
		{payment.StatusAwaitingFinality, payment.StatusEnqueued}: true,
		{payment.StatusAwaitingFinality, payment.StatusFailed}:   true,
		{payment.StatusFailed, payment.StatusPending}:            true,
	}
	for _, from := range payment.Statuses {
		for _, to := range payment.Statuses {
			require.Equal(t, allowed[[2]payment.Status{from, to}], payment.CanTransition(from, to), "%s → %s", from, to)
		}
	}
	require.False(t, payment.CanTransition(payment.StatusConfirmed, payment.StatusPending), "confirmed is final")
}

func TestTransitionErrorClassification(t *testing.T) {
	terminal := &payment.TransitionError{EventID: "e", From: payment.StatusEnqueued, To: payment.StatusProcessing, Actual: payment.StatusConfirmed}
	require.True(t, errors.Is(terminal, payment.ErrAlreadyProcessed))
	require.False(t, errors.Is(terminal, payment.ErrRetryable))

	moving := &payment.TransitionError{EventID: "e", From: payment.StatusEnqueued, To: payment.StatusProcessing, Actual: payment.StatusPending}
	require.True(t, errors.Is(moving, payment.ErrRetryable))
	require.False(t, errors.Is(moving, payment.ErrAlreadyProcessed))
}

func TestKindErrorsKeepTheirChain(t *testing.T) {
	cause := errors.New("socket closed")
	err := payment.Retryable("apply batch", cause)
	require.ErrorIs(t, err, payment.ErrRetryable)
	require.ErrorIs(t, err, cause)
	require.ErrorIs(t, payment.Invalid("user %d unknown", 3), payment.ErrInvalid)
	require.ErrorIs(t, payment.Unavailable("dial", cause), payment.ErrUnavailable)
}

func TestEventTypes(t *testing.T) {
	for _, s := range []string{"deposit", "airdrop", "withdrawal", "withdrawal_fee"} {
		_, ok := payment.ParseWebhookEventType(s)
		require.True(t, ok, s)
	}
	for _, s := range []string{"reorg_compensation", "Deposit", "refund", ""} {
		_, ok := payment.ParseWebhookEventType(s)
		require.False(t, ok, s)
	}
	require.True(t, payment.Deposit.Credit())
	require.True(t, payment.Airdrop.Credit())
	require.False(t, payment.Withdrawal.Credit())
	require.False(t, payment.WithdrawalFee.Credit())
	require.False(t, payment.ReorgCompensation.Credit())
}
