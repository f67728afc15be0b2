package payment

// HoldStatus is where a hold stands. The transition table below is the
// only source of truth for its moves; migration 0011's CHECK constraints
// and trigger mirror it, and a test proves the two agree edge by edge.
type HoldStatus string

const (
	// HoldOpen: the amount is reserved; available = balance − open holds.
	HoldOpen HoldStatus = "open"
	// HoldPosted: a post turned the hold into a journal debit.
	HoldPosted HoldStatus = "posted"
	// HoldVoided: a void released the amount; no money moved.
	HoldVoided HoldStatus = "voided"
)

// HoldStatuses lists every hold status in a fixed order.
var HoldStatuses = []HoldStatus{HoldOpen, HoldPosted, HoldVoided}

// holdTransitions: a hold resolves once.
//
//	open → posted (withdrawal_post), voided (withdrawal_void)
var holdTransitions = map[HoldStatus][]HoldStatus{
	HoldOpen: {HoldPosted, HoldVoided},
}

// CanTransition reports whether from → to is an allowed edge.
func (s HoldStatus) CanTransition(to HoldStatus) bool {
	for _, next := range holdTransitions[s] {
		if next == to {
			return true
		}
	}
	return false
}

// Resolved reports whether the hold is posted or voided, for good.
func (s HoldStatus) Resolved() bool { return s != HoldOpen }

// Valid reports whether s is a known hold status.
func (s HoldStatus) Valid() bool {
	for _, k := range HoldStatuses {
		if k == s {
			return true
		}
	}
	return false
}

// HoldResolution is the status a post or void moves its hold to.
func HoldResolution(t EventType) (HoldStatus, bool) {
	switch t {
	case WithdrawalPost:
		return HoldPosted, true
	case WithdrawalVoid:
		return HoldVoided, true
	}
	return "", false
}
