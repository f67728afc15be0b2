package money_test

import (
	"math/big"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/money"
)

func TestParse(t *testing.T) {
	cases := []struct {
		in    string
		scale int
		want  string // canonical value, or "" when an error is expected
		err   error
	}{
		{in: "50", scale: 18, want: "50"},
		{in: "50.1", scale: 18, want: "50.1"},
		{in: "0.000000000000000001", scale: 18, want: "0.000000000000000001"},
		{in: "50.0000000000000000000", scale: 18, want: "50"},                   // 19 zeros normalise away
		{in: "1.0000000000000000000000000000000000000000", scale: 6, want: "1"}, // trailing zeros never count
		{in: "99999999999999999999.999999999999999999", scale: 18, want: "99999999999999999999.999999999999999999"},
		{in: "1e19", scale: 18, want: "10000000000000000000"},
		{in: "1E19", scale: 18, want: "10000000000000000000"},
		{in: "9.99e19", scale: 18, want: "99900000000000000000"},
		{in: "1e-18", scale: 18, want: "0.000000000000000001"},
		{in: "1e+2", scale: 0, want: "100"},
		{in: "000123.4500", scale: 2, want: "123.45"},
		{in: "3.000000000000000001", scale: 18, want: "3.000000000000000001"},
		{in: "1.5e0001", scale: 0, want: "15"},
		{in: "0.5e1", scale: 0, want: "5"},
		// magnitude: below 10^20, and exactly 10^20 is refused
		{in: "100000000000000000000", scale: 18, err: money.ErrTooLarge},
		{in: "1e20", scale: 18, err: money.ErrTooLarge},
		{in: "99999999999999999999", scale: 0, want: "99999999999999999999"},
		{in: "1e99999", scale: 18, err: money.ErrTooLarge},
		{in: "1e999999999999999999999", scale: 18, err: money.ErrTooLarge},
		// precision
		{in: "0.0000000000000000001", scale: 18, err: money.ErrPrecision},
		{in: "1e-19", scale: 18, err: money.ErrPrecision},
		{in: "1e-99999", scale: 18, err: money.ErrPrecision},
		{in: "0.0000001", scale: 6, err: money.ErrPrecision},
		{in: "0.000001", scale: 6, want: "0.000001"},
		{in: "1.5", scale: 0, err: money.ErrPrecision},
		// zero and negatives
		{in: "0", scale: 18, err: money.ErrNotPositive},
		{in: "0.000", scale: 18, err: money.ErrNotPositive},
		{in: "0e5", scale: 18, err: money.ErrNotPositive},
		{in: "0e99999", scale: 18, err: money.ErrNotPositive},
		{in: "-1", scale: 18, err: money.ErrSyntax},
		{in: "-0", scale: 18, err: money.ErrSyntax},
		// what Python's Decimal once accepted
		{in: "+50.1", scale: 18, err: money.ErrSyntax},
		{in: "1_000", scale: 18, err: money.ErrSyntax},
		{in: "١٢٣", scale: 18, err: money.ErrSyntax}, // Arabic-Indic digits
		{in: "５", scale: 18, err: money.ErrSyntax},   // full-width digit
		{in: " 50", scale: 18, err: money.ErrSyntax},
		{in: "50 ", scale: 18, err: money.ErrSyntax},
		{in: "50\n", scale: 18, err: money.ErrSyntax},
		{in: "NaN", scale: 18, err: money.ErrSyntax},
		{in: "Infinity", scale: 18, err: money.ErrSyntax},
		{in: "inf", scale: 18, err: money.ErrSyntax},
		{in: "", scale: 18, err: money.ErrSyntax},
		{in: ".5", scale: 18, err: money.ErrSyntax},
		{in: "5.", scale: 18, err: money.ErrSyntax},
		{in: "5..0", scale: 18, err: money.ErrSyntax},
		{in: "0x10", scale: 18, err: money.ErrSyntax},
		{in: "1e", scale: 18, err: money.ErrSyntax},
		{in: "1e+", scale: 18, err: money.ErrSyntax},
		{in: "e5", scale: 18, err: money.ErrSyntax},
		{in: "1,5", scale: 18, err: money.ErrSyntax},
		{in: strings.Repeat("1", 257), scale: 18, err: money.ErrSyntax},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := money.Parse(tc.in, tc.scale)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, money.Canonical(got))
		})
	}
}

func TestParseScaleBounds(t *testing.T) {
	_, err := money.Parse("1", -1)
	require.Error(t, err)
	_, err = money.Parse("1", 19)
	require.Error(t, err)
}

func TestFromBaseUnits(t *testing.T) {
	cases := []struct {
		hex      string
		decimals int
		want     string
		err      error
	}{
		{hex: "0xde0b6b3a7640000", decimals: 18, want: "1"}, // 10^18 wei
		{hex: "0x1", decimals: 18, want: "0.000000000000000001"},
		{hex: "0x0F4240", decimals: 6, want: "1"}, // 1,000,000 USDC base units
		{hex: "0x2faf080", decimals: 8, want: "0.5"},
		{hex: "0x" + strings.Repeat("0", 63) + "1", decimals: 0, want: "1"},
		{hex: "0x", decimals: 18, err: money.ErrSyntax}, // NFT transfers carry no value
		{hex: "0x0", decimals: 18, err: money.ErrNotPositive},
		{hex: "0x00", decimals: 6, err: money.ErrNotPositive},
		{hex: "de0b6b3a7640000", decimals: 18, err: money.ErrSyntax},
		{hex: "0xzz", decimals: 18, err: money.ErrSyntax},
		{hex: "0x+1", decimals: 18, err: money.ErrSyntax},
		{hex: "0x" + strings.Repeat("f", 65), decimals: 18, err: money.ErrSyntax},
		{hex: "0x56bc75e2d63100000", decimals: 0, err: money.ErrTooLarge}, // exactly 10^20
		{hex: "0x56bc75e2d630fffff", decimals: 0, want: "99999999999999999999"},
		{hex: "0x" + strings.Repeat("f", 64), decimals: 18, err: money.ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.hex, func(t *testing.T) {
			got, err := money.FromBaseUnits(tc.hex, tc.decimals)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, money.Canonical(got))
			units, ok := money.ToBaseUnits(got, tc.decimals)
			require.True(t, ok)
			back, err := money.FromBaseUnits("0x"+units.Text(16), tc.decimals)
			require.NoError(t, err)
			require.True(t, back.Equal(got))
		})
	}
}

func TestToBaseUnitsRefusesFinerDigits(t *testing.T) {
	_, ok := money.ToBaseUnits(decimal.RequireFromString("0.0000001"), 6)
	require.False(t, ok)
}

// TestToBaseUnitsRefusesDecimalsOutOfRange: 1<<32 decimals would wrap to a
// shift of 0 in int32 and turn 1 into one base unit.
func TestToBaseUnitsRefusesDecimalsOutOfRange(t *testing.T) {
	for _, decimals := range []int{-1, money.ScaleMax + 1, 1 << 32} {
		_, ok := money.ToBaseUnits(decimal.RequireFromString("1"), decimals)
		require.False(t, ok, "decimals %d", decimals)
	}
	units, ok := money.ToBaseUnits(decimal.RequireFromString("1"), money.ScaleMax)
	require.True(t, ok)
	require.Equal(t, "1000000000000000000", units.String())
}

func TestFitsBalance(t *testing.T) {
	require.True(t, money.FitsBalance(decimal.Zero))
	require.True(t, money.FitsBalance(decimal.RequireFromString("99999999999999999999.999999999999999999")))
	require.False(t, money.FitsBalance(decimal.New(1, 20)))
	require.False(t, money.FitsBalance(decimal.New(-1, -18)))
}

// FuzzParse: no input panics, and every accepted amount is positive, below
// 10^20, within the scale, and round-trips through its canonical form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"50", "50.0000000000000000000", "1e19", "1e-18", "+1", "1_0", "١", "0", "1e99999", " 1", "9.99e19"} {
		f.Add(s, 18)
	}
	f.Fuzz(func(t *testing.T, s string, scale int) {
		scale = ((scale % 19) + 19) % 19
		got, err := money.Parse(s, scale)
		if err != nil {
			return
		}
		if got.Sign() <= 0 || got.Cmp(decimal.New(1, 20)) >= 0 {
			t.Fatalf("accepted out-of-range %q → %s", s, got)
		}
		if -got.Exponent() > int32(scale) && !got.Equal(got.Round(int32(scale))) {
			t.Fatalf("accepted %q with more than %d fractional digits", s, scale)
		}
		again, err := money.Parse(money.Canonical(got), scale)
		if err != nil || !again.Equal(got) {
			t.Fatalf("canonical form of %q does not round-trip: %v", s, err)
		}
		for _, r := range s {
			if !strings.ContainsRune("0123456789.eE+-", r) {
				t.Fatalf("accepted %q with character %q", s, r)
			}
		}
	})
}

// FuzzFromBaseUnits: no input panics; accepted values round-trip exactly:
// ToBaseUnits gives back the very integer the hex spelled.
func FuzzFromBaseUnits(f *testing.F) {
	for _, s := range []string{"0x1", "0x", "0x0", "0xde0b6b3a7640000", "0xg"} {
		f.Add(s, 18)
	}
	f.Fuzz(func(t *testing.T, hex string, decimals int) {
		decimals = ((decimals % 19) + 19) % 19
		got, err := money.FromBaseUnits(hex, decimals)
		if err != nil {
			return
		}
		units, ok := money.ToBaseUnits(got, decimals)
		if !ok || units.Sign() <= 0 {
			t.Fatalf("%q → %s does not map back to base units", hex, got)
		}
		want, ok := new(big.Int).SetString(hex[2:], 16)
		if !ok || units.Cmp(want) != 0 {
			t.Fatalf("%q → %s → %s base units, want %s", hex, got, units, want)
		}
	})
}
