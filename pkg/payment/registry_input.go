package payment

import (
	"fmt"
	"regexp"
	"strings"
)

// What an operator may add to the registry (settlectl networks/assets
// add, POST /admin/networks and /admin/assets): the same rules as the
// tables' CHECKs, checked first so a typo is a clear refusal, not a
// constraint error.
const (
	// DecimalsMax is the most decimals a listing may have: NUMERIC(38,18)
	// holds no finer unit.
	DecimalsMax = 18
)

var (
	networkNamePattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)
	assetCodePattern   = regexp.MustCompile(`^[A-Z][A-Z0-9]{0,15}$`)
	contractPattern    = regexp.MustCompile(`^0x[0-9a-fA-F]{40}$`)
)

// ValidNetworkName reports whether s is a network name like ETH_MAINNET.
func ValidNetworkName(s string) bool { return networkNamePattern.MatchString(s) }

// ValidAssetCode reports whether s is a ledger code like USDC.
func ValidAssetCode(s string) bool { return assetCodePattern.MatchString(s) }

// NormalizeContract checks a 0x + 40 hex contract address in any letter
// case and returns it lowercase, as every table stores it.
func NormalizeContract(s string) (string, bool) {
	if !contractPattern.MatchString(s) {
		return "", false
	}
	return strings.ToLower(s), true
}

// ValidDecimals reports whether d is a listing's possible decimals.
func ValidDecimals(d int64) bool { return d >= 0 && d <= DecimalsMax }

// CheckNetwork validates a network an operator adds: its name, its
// chain id (what eth_chainId must answer, above zero), and its native
// coin's code and decimals. The error is an InputError naming the field.
func CheckNetwork(name string, chainID int64, native string, decimals int64) error {
	switch {
	case !ValidNetworkName(name):
		return inputError("name %q is not a network name like ETH_MAINNET (^[A-Z][A-Z0-9_]{0,63}$)", clip(name))
	case chainID <= 0:
		return inputError("chain id must be an integer above zero")
	case !ValidAssetCode(native):
		return inputError("native %q is not an asset code like ETH (^[A-Z][A-Z0-9]{0,15}$)", clip(native))
	case !ValidDecimals(decimals):
		return inputError("decimals must be an integer from 0 to %d", DecimalsMax)
	}
	return nil
}

// CheckListing validates a listing an operator adds and returns it with
// its contract lowercased; an empty contract lists the network's native
// coin.
func CheckListing(network, code, contract string, decimals int64) (Asset, error) {
	switch {
	case !ValidNetworkName(network):
		return Asset{}, inputError("network %q is not a network name like ETH_MAINNET (^[A-Z][A-Z0-9_]{0,63}$)", clip(network))
	case !ValidAssetCode(code):
		return Asset{}, inputError("asset %q is not an asset code like USDC (^[A-Z][A-Z0-9]{0,15}$)", clip(code))
	case !ValidDecimals(decimals):
		return Asset{}, inputError("decimals must be an integer from 0 to %d", DecimalsMax)
	}
	if contract != "" {
		normalized, ok := NormalizeContract(contract)
		if !ok {
			return Asset{}, inputError("contract %q is not 0x followed by 40 hex digits", clip(contract))
		}
		contract = normalized
	}
	return Asset{Code: code, Network: network, Contract: contract, Decimals: int(decimals)}, nil
}

// InputError is a refusal of what an operator typed, worded for them;
// it is ErrInvalid.
type InputError struct{ Message string }

func (e *InputError) Error() string { return e.Message }

// Is makes an InputError invalid input.
func (e *InputError) Is(target error) bool { return target == ErrInvalid }

func inputError(format string, args ...any) error {
	return &InputError{Message: fmt.Sprintf(format, args...)}
}

// clipLengthMax bounds outside text quoted back in a refusal.
const clipLengthMax = 70

func clip(s string) string {
	if len(s) > clipLengthMax {
		return s[:clipLengthMax] + "…"
	}
	return s
}
