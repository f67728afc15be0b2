package chain

import (
	"fmt"
	"strconv"
	"strings"
)

// PolicyKind names how a deposit's transaction earns its credit.
type PolicyKind string

const (
	// Finalized: the transaction's block is at or below the `finalized` block.
	Finalized PolicyKind = "finalized"
	// Confirmations: the head is at least N-1 blocks past the transaction's block.
	Confirmations PolicyKind = "confirmations"
	// None: a successful receipt is enough.
	None PolicyKind = "none"
)

// Bounds of confirmations:N. 10,000 blocks is well over a day on mainnet;
// anything beyond is a typo, and it would outlast every FINALITY_TIMEOUT.
const (
	ConfirmationsMin = 1
	ConfirmationsMax = 10_000
)

// Policy is a parsed DEPOSIT_FINALITY. The zero value is not valid; use
// ParsePolicy or the constructors.
type Policy struct {
	kind          PolicyKind
	confirmations uint64
}

// FinalizedPolicy is the default policy.
func FinalizedPolicy() Policy { return Policy{kind: Finalized} }

// NonePolicy credits as soon as a successful receipt exists.
func NonePolicy() Policy { return Policy{kind: None} }

// ConfirmationsPolicy waits for n blocks (the transaction's own included).
func ConfirmationsPolicy(n uint64) (Policy, error) {
	if n < ConfirmationsMin || n > ConfirmationsMax {
		return Policy{}, fmt.Errorf("confirmations must be between %d and %d, got %d", ConfirmationsMin, ConfirmationsMax, n)
	}
	return Policy{kind: Confirmations, confirmations: n}, nil
}

// ParsePolicy reads DEPOSIT_FINALITY: `finalized`, `confirmations:N` or
// `none`. Anything else is an error, never a default.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case string(Finalized):
		return FinalizedPolicy(), nil
	case string(None):
		return NonePolicy(), nil
	}
	digits, ok := strings.CutPrefix(s, string(Confirmations)+":")
	if !ok {
		return Policy{}, fmt.Errorf("deposit finality %q is not finalized, confirmations:N or none", s)
	}
	// ParseUint alone accepts nothing but ASCII digits, yet it would take
	// leading zeros; "confirmations:007" is refused so that a value has
	// one spelling (String round-trips).
	if digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return Policy{}, fmt.Errorf("deposit finality %q: N must be a plain integer", s)
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return Policy{}, fmt.Errorf("deposit finality %q: N must be a plain integer", s)
	}
	p, err := ConfirmationsPolicy(n)
	if err != nil {
		return Policy{}, fmt.Errorf("deposit finality %q: %w", s, err)
	}
	return p, nil
}

// Kind is the policy's kind; empty for the zero Policy.
func (p Policy) Kind() PolicyKind { return p.kind }

// Confirmations is N of confirmations:N, else 0.
func (p Policy) Confirmations() uint64 { return p.confirmations }

// Valid reports whether p came from ParsePolicy or a constructor.
func (p Policy) Valid() bool {
	switch p.kind {
	case Finalized, None:
		return p.confirmations == 0
	case Confirmations:
		return p.confirmations >= ConfirmationsMin && p.confirmations <= ConfirmationsMax
	}
	return false
}

// String is the DEPOSIT_FINALITY spelling; ParsePolicy(p.String()) == p.
func (p Policy) String() string {
	if p.kind == Confirmations {
		return fmt.Sprintf("%s:%d", Confirmations, p.confirmations)
	}
	return string(p.kind)
}

// WatchesReorgs says whether deposits credited under p must be watched
// until their block is finalized: they were credited before finality under
// confirmations:N, and under none when there is an RPC to watch them with.
func (p Policy) WatchesReorgs(haveRPC bool) bool {
	switch p.kind {
	case Confirmations:
		return true
	case None:
		return haveRPC
	}
	return false
}
