package httpapi

import "github.com/settle/settle/pkg/payment"

// Outcomes and reasons of provider reorg reports (handled by the intake:
// intakeRun.removed and intakeRun.again).
const (
	// outcomeRechecked: a removed transfer handed to the chain to decide.
	outcomeRechecked = "rechecked"
	// outcomeReopened: a failed/reorged deposit reported again.
	outcomeReopened = "reopened"
	// reasonRemovedFinal: a removed transfer whose deposit is credited
	// and final; the chain outranks the report.
	reasonRemovedFinal payment.IgnoreReason = "removed_final"
	// reasonRemovedFailed: a removed transfer whose deposit failed already.
	reasonRemovedFailed payment.IgnoreReason = "removed_failed"
)

// hasRPC tells whether the chain of a network can be asked: then a
// provider's reorg report is a reason to ask, never evidence by itself.
// The api has one ETH_RPC_URL, which serves every network it knows.
func (s *Server) hasRPC(string) bool { return s.chain != nil }

// chainStateWatching marks a deposit credited before finality.
const chainStateWatching = "watching"
