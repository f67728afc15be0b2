package payment_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

func TestNormalizeHex(t *testing.T) {
	got, ok := payment.NormalizeHex("0XAbCdEf0000000000000000000000000000000001", 40)
	require.True(t, ok)
	require.Equal(t, "0xabcdef0000000000000000000000000000000001", got)
	for _, bad := range []string{"", "0x", "abcdef0000000000000000000000000000000001", "0xabcdef000000000000000000000000000000001", "0xg" + strings.Repeat("0", 39)} {
		_, ok := payment.NormalizeHex(bad, 40)
		require.False(t, ok, bad)
	}
	n, ok := payment.ParseQuantity("0x6E")
	require.True(t, ok)
	require.EqualValues(t, 110, n)
	for _, bad := range []string{"", "0x", "110", "0x1" + strings.Repeat("0", 16), "0x-1"} {
		_, ok := payment.ParseQuantity(bad)
		require.False(t, ok, bad)
	}
}

// FuzzProviderHex: whatever a provider writes, a normalized hash or
// address is the input lowercased, of its length, and normalizes to
// itself; a quantity read back from its own spelling is the same number.
func FuzzProviderHex(f *testing.F) {
	f.Add("0x7a250d5630B4cF539739dF2C5dAcb4c659F2488D", "0x6e")
	f.Add("0X"+strings.Repeat("F", 64), "0xffffffffffffffff")
	f.Add("0x", "0x10000000000000000")
	f.Fuzz(func(t *testing.T, s, quantity string) {
		for _, digits := range []int{40, 64} {
			got, ok := payment.NormalizeHex(s, digits)
			if !ok {
				continue
			}
			if got != strings.ToLower(s) || len(got) != 2+digits {
				t.Fatalf("%q normalized to %q", s, got)
			}
			if again, ok := payment.NormalizeHex(got, digits); !ok || again != got {
				t.Fatalf("%q does not normalize to itself: %q", got, again)
			}
		}
		if n, ok := payment.ParseQuantity(quantity); ok {
			if back, ok := payment.ParseQuantity("0x" + strconv.FormatUint(n, 16)); !ok || back != n {
				t.Fatalf("%q read %d, its own spelling %d", quantity, n, back)
			}
		}
	})
}
