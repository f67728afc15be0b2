// Package money parses and validates amounts exactly. Amounts never pass
// through a float: they arrive as strings, are checked against a strict
// grammar, and become decimal.Decimal values.
package money

import (
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/shopspring/decimal"
)

const (
	// ScaleMax is the number of fractional digits the NUMERIC(38,18) columns hold.
	ScaleMax = 18
	// IntegerDigitsMax bounds the magnitude: every amount is below 10^20.
	IntegerDigitsMax = 20
	// inputLengthMax bounds the text of one amount; longer input is refused
	// before any arithmetic so a hostile string cannot cost memory or time.
	inputLengthMax = 256
	// exponentDigitsMax bounds the exponent's text: "1e99999" is refused as
	// too large (or too precise) without ever building 10^99999.
	exponentDigitsMax = 4
	// baseUnitsHexDigitsMax is the width of a uint256, the largest value an
	// ERC-20 transfer can carry.
	baseUnitsHexDigitsMax = 64
)

// Error kinds; every parse error wraps exactly one of them.
var (
	ErrSyntax      = errors.New("amount is not a plain decimal string")
	ErrNotPositive = errors.New("amount must be greater than zero")
	ErrTooLarge    = errors.New("amount must be below 10^20")
	ErrPrecision   = errors.New("amount has more fractional digits than the asset allows")
)

// Parse validates s against the wire grammar
// ^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$ and the magnitude and precision
// rules, and returns the exact value. scaleMax is the number of fractional
// digits allowed once trailing zeros are dropped: an asset's decimals, or
// ScaleMax.
func Parse(s string, scaleMax int) (decimal.Decimal, error) {
	if scaleMax < 0 || scaleMax > ScaleMax {
		return decimal.Decimal{}, fmt.Errorf("scale %d outside 0..%d", scaleMax, ScaleMax)
	}
	n, err := scan(s)
	if err != nil {
		return decimal.Decimal{}, err
	}
	// Normalise to digits × 10^exp with no leading zeros in digits and no
	// trailing zeros (those move into exp).
	digits := strings.TrimLeft(n.digits, "0")
	if digits == "" {
		return decimal.Decimal{}, fmt.Errorf("%w: %q", ErrNotPositive, s)
	}
	trimmed := strings.TrimRight(digits, "0")
	exp := n.exp + (len(digits) - len(trimmed))
	digits = trimmed

	// The value has len(digits)+exp integer digits.
	if len(digits)+exp > IntegerDigitsMax {
		return decimal.Decimal{}, fmt.Errorf("%w: %q", ErrTooLarge, s)
	}
	if -exp > scaleMax {
		return decimal.Decimal{}, fmt.Errorf("%w: %q has %d fractional digits, at most %d", ErrPrecision, s, -exp, scaleMax)
	}
	coefficient, ok := new(big.Int).SetString(digits, 10)
	if !ok {
		return decimal.Decimal{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	// exp is within [-scaleMax, IntegerDigitsMax] by the two checks above.
	return decimal.NewFromBigInt(coefficient, int32(exp)), nil //nolint:gosec // G115: bounded above
}

// number is the lexical form of an amount: every mantissa digit with the
// decimal point removed, and the power of ten they are scaled by.
type number struct {
	digits string
	exp    int
}

// scan checks the grammar by hand and bounds every part of the input.
func scan(s string) (number, error) {
	if len(s) == 0 || len(s) > inputLengthMax {
		return number{}, fmt.Errorf("%w: length %d", ErrSyntax, len(s))
	}
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[:i]
	if intPart == "" {
		return number{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	fracPart := ""
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		fracPart = s[start:i]
		if fracPart == "" {
			return number{}, fmt.Errorf("%w: %q", ErrSyntax, s)
		}
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		negative := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			negative = s[i] == '-'
			i++
		}
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == start {
			return number{}, fmt.Errorf("%w: %q", ErrSyntax, s)
		}
		expText := strings.TrimLeft(s[start:i], "0")
		if len(expText) > exponentDigitsMax {
			// |exp| ≥ 10^4 is outside both bounds whatever the mantissa,
			// unless the mantissa is zero, which is refused for its own reason.
			switch {
			case strings.Trim(intPart+fracPart, "0") == "":
				return number{}, fmt.Errorf("%w: %q", ErrNotPositive, s)
			case negative:
				return number{}, fmt.Errorf("%w: %q", ErrPrecision, s)
			default:
				return number{}, fmt.Errorf("%w: %q", ErrTooLarge, s)
			}
		}
		for _, c := range expText {
			exp = exp*10 + int(c-'0')
		}
		if negative {
			exp = -exp
		}
	}
	if i != len(s) {
		return number{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	return number{digits: intPart + fracPart, exp: exp - len(fracPart)}, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// FromBaseUnits converts a hex count of base units ("0x" + 1..64 hex
// digits, as in Alchemy's rawContract.rawValue) into the asset's amount,
// exactly: units / 10^decimals. "0x" alone (NFT transfers) and zero are
// refused, as is anything at or above 10^20.
func FromBaseUnits(hex string, decimals int) (decimal.Decimal, error) {
	if decimals < 0 || decimals > ScaleMax {
		return decimal.Decimal{}, fmt.Errorf("decimals %d outside 0..%d", decimals, ScaleMax)
	}
	if len(hex) < 3 || (hex[:2] != "0x" && hex[:2] != "0X") || len(hex)-2 > baseUnitsHexDigitsMax {
		return decimal.Decimal{}, fmt.Errorf("%w: base units %q are not 0x and 1..%d hex digits", ErrSyntax, hex, baseUnitsHexDigitsMax)
	}
	for _, c := range hex[2:] {
		if !isHexDigit(c) {
			return decimal.Decimal{}, fmt.Errorf("%w: base units %q are not hex", ErrSyntax, hex)
		}
	}
	units, _ := new(big.Int).SetString(hex[2:], 16)
	if units.Sign() == 0 {
		return decimal.Decimal{}, fmt.Errorf("%w: base units %q", ErrNotPositive, hex)
	}
	amount := decimal.NewFromBigInt(units, int32(-decimals))
	if err := CheckRange(amount); err != nil {
		return decimal.Decimal{}, err
	}
	return amount, nil
}

func isHexDigit(c rune) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// ToBaseUnits is the inverse of FromBaseUnits; it reports false when the
// amount has digits finer than the asset's decimals, or decimals is outside
// 0..ScaleMax (so the shift never wraps).
func ToBaseUnits(amount decimal.Decimal, decimals int) (*big.Int, bool) {
	if decimals < 0 || decimals > ScaleMax {
		return nil, false
	}
	scaled := amount.Shift(int32(decimals))
	if !scaled.Equal(scaled.Truncate(0)) {
		return nil, false
	}
	return scaled.BigInt(), true
}

var upperBound = decimal.New(1, IntegerDigitsMax)

// CheckRange reports whether a computed amount is positive and below 10^20.
func CheckRange(amount decimal.Decimal) error {
	if amount.Sign() <= 0 {
		return fmt.Errorf("%w: %s", ErrNotPositive, amount)
	}
	if amount.Cmp(upperBound) >= 0 {
		return fmt.Errorf("%w: %s", ErrTooLarge, amount)
	}
	return nil
}

// FitsBalance reports whether a balance can be stored: not negative and
// below 10^20, the bounds of NUMERIC(38,18) with the CHECK (balance >= 0).
func FitsBalance(balance decimal.Decimal) bool {
	return balance.Sign() >= 0 && balance.Cmp(upperBound) < 0
}

// Canonical renders an amount in its shortest exact form ("50.0" → "50"),
// the form used in content hashes and responses.
func Canonical(amount decimal.Decimal) string {
	return amount.String()
}
