package payment

import (
	"strconv"
	"strings"
)

// Transfer indexes name one movement of value inside a transaction.
const (
	// TransferNative is the transaction's own value.
	TransferNative = "native"
	// transferTracePrefix starts the index of ETH moved by a contract call
	// ("trace:" + the trace address in lowercase).
	transferTracePrefix = "trace:"
	// transferUnresolvedPrefix marks a claim on some transfer of a
	// transaction that could not be named (see migration 0007).
	transferUnresolvedPrefix = "unresolved:"
	// traceAddressLengthMax bounds a trace address so that every derived
	// event id fits payment_events.event_id with room for "reorg:".
	traceAddressLengthMax = 96
	// logIndexDigitsMax: a log index is a uint64.
	logIndexDigitsMax = 20
	// TransferEventIDPrefix starts every event id derived from a transfer.
	TransferEventIDPrefix = "chain:"
)

// Transfer is one on-chain transfer: what a deposit with a transaction
// claims, and what credits at most once.
type Transfer struct {
	Network string
	TxHash  string // 0x + 64 lowercase hex
	Index   string // a decimal log index, "native", or "trace:<address>"
}

// EventID is the id of the deposit a transfer makes, whoever reports it:
// Alchemy, another provider or the chain scanner derive the same id from
// the same transfer, so they store one event.
func (t Transfer) EventID() string {
	return TransferEventIDPrefix + t.Network + ":" + t.TxHash + ":" + t.Index
}

// LogIndexTransfer is the index of the ERC-20 Transfer log at logIndex.
func LogIndexTransfer(logIndex uint64) string { return strconv.FormatUint(logIndex, 10) }

// TraceTransfer is the index of ETH moved by the contract call at a trace
// address. Reporters spell the call type differently (Alchemy "call_0_1",
// a Parity-style trace "CALL_0_1"): the index is lowercase, so one frame
// makes one event id and one claim whoever reports it.
func TraceTransfer(traceAddress string) string {
	return transferTracePrefix + strings.ToLower(traceAddress)
}

// ParseTransferIndex validates an index as a caller may give it.
func ParseTransferIndex(s string) (string, error) {
	switch {
	case s == TransferNative:
		return s, nil
	case strings.HasPrefix(s, transferTracePrefix):
		address := strings.TrimPrefix(s, transferTracePrefix)
		if !validTraceAddress(address) {
			return "", Invalid("transfer_index %q: a trace address is 1 to %d letters, digits or underscores", s, traceAddressLengthMax)
		}
		return TraceTransfer(address), nil
	}
	if len(s) == 0 || len(s) > logIndexDigitsMax {
		return "", Invalid("transfer_index %q is not a log index, %q or %q<address>", s, TransferNative, transferTracePrefix)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return "", Invalid("transfer_index %q is not a log index, %q or %q<address>", s, TransferNative, transferTracePrefix)
	}
	// Canonical form: "007" and "7" are one log.
	return strconv.FormatUint(n, 10), nil
}

// InternalTransfer tells whether an index names ETH moved by a contract
// call, which neither the transaction nor its receipt shows.
func InternalTransfer(index string) bool { return strings.HasPrefix(index, transferTracePrefix) }

// TraceAddress is the trace address an internal transfer's index names.
func TraceAddress(index string) (string, bool) { return strings.CutPrefix(index, transferTracePrefix) }

// LogIndex returns the log index an index names, if it names one.
func LogIndex(index string) (uint64, bool) {
	if index == "" || index == TransferNative || strings.Contains(index, ":") {
		return 0, false
	}
	n, err := strconv.ParseUint(index, 10, 64)
	return n, err == nil
}

// UnresolvedTransfer is the index of a claim on an unnamed transfer of the
// event's transaction.
func UnresolvedTransfer(eventID string) string { return transferUnresolvedPrefix + eventID }

// Unresolved tells whether an index is such a claim.
func Unresolved(index string) bool { return strings.HasPrefix(index, transferUnresolvedPrefix) }

// ValidTraceAddress accepts a provider's trace address ("call_0_1", in
// either case).
func ValidTraceAddress(s string) bool { return validTraceAddress(s) }

func validTraceAddress(s string) bool {
	if len(s) == 0 || len(s) > traceAddressLengthMax {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
