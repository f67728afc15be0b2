package payment

import (
	"strconv"
	"strings"

	"github.com/shopspring/decimal"
)

// ReportedTransfer is a fungible transfer a provider reported that could
// be a deposit: what every provider's decoder gives the intake, which
// still has to find the recipient among the deposit addresses. Its
// identity (network, hash, index) names the event, whoever reports it.
type ReportedTransfer struct {
	Transfer
	ToAddress string // lowercase
	Asset     Asset
	// Amount is the raw integer the provider sent over 10^decimals of the
	// registered asset, exactly; a provider's float or pre-scaled value
	// is never read.
	Amount decimal.Decimal
	// Removed: the provider says a reorg took the transfer away; the
	// deposit is reversed (or the chain asked) rather than credited.
	Removed bool
	// Reorged (with Removed): the provider sent the transfer again after a
	// reorg, on the new branch (QuickNode's blocks_reorged). Where the
	// chain can be asked, a new one is stored like any other (the finality
	// gate asks before any credit) and a known one re-checked at once;
	// where it cannot, it is a removal like Alchemy's.
	Reorged bool
	// BlockHash is the block the provider saw the transfer in (0x and 64
	// lowercase hex digits), where its report names it (Alchemy's token
	// logs, QuickNode's logs and blocks, Moralis's deliveries); "" otherwise.
	// Where the chain cannot be asked, it orders a transfer's adds and
	// removals, whichever provider reports them.
	BlockHash string
}

// IgnoreReason says why a reported candidate is not a deposit event. The
// set is fixed (these, each provider's own, the intake's), so it labels
// the providers' metrics.
type IgnoreReason string

// Reasons more than one provider's decoder gives.
const (
	IgnoreMalformed        IgnoreReason = "malformed"
	IgnoreNFT              IgnoreReason = "nft"
	IgnoreUnknownNetwork   IgnoreReason = "unknown_network"
	IgnoreUnknownAsset     IgnoreReason = "unknown_asset"
	IgnoreZeroAmount       IgnoreReason = "zero_amount"
	IgnoreAmountOutOfRange IgnoreReason = "amount_out_of_range"
	// IgnoreNoReceipt: a transaction whose status the delivery does not
	// carry; its value is not proven moved.
	IgnoreNoReceipt IgnoreReason = "no_receipt"
	// IgnoreFailed: the receipt says the transaction reverted.
	IgnoreFailed IgnoreReason = "failed_transaction"
)

// Ignored is a candidate of a delivery (by its position) that is no
// transfer settle credits.
type Ignored struct {
	Index  int
	Reason IgnoreReason
}

// quantityHexDigitsMax: a quantity a provider reports (a log index, a
// block number) is a uint64.
const quantityHexDigitsMax = 16

// NormalizeHex checks "0x" + digits hex digits in any letter case, as a
// provider writes a hash (64) or an address (40), and returns it
// lowercase, as settle stores it.
func NormalizeHex(s string, digits int) (string, bool) {
	if len(s) != 2+digits || (s[:2] != "0x" && s[:2] != "0X") {
		return "", false
	}
	for i := 2; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return "", false
		}
	}
	return "0x" + strings.ToLower(s[2:]), true
}

// ParseQuantity reads an Ethereum hex quantity ("0x6e") of a uint64.
func ParseQuantity(s string) (uint64, bool) {
	if len(s) < 3 || len(s) > 2+quantityHexDigitsMax || (s[:2] != "0x" && s[:2] != "0X") {
		return 0, false
	}
	n, err := strconv.ParseUint(s[2:], 16, 64)
	return n, err == nil
}
