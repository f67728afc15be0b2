package alchemy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// TypeAddressActivity is the only webhook type that carries transfers we
// credit; any other type is acknowledged and ignored.
const TypeAddressActivity = "ADDRESS_ACTIVITY"

// Bounds on what one payload may hold. The HTTP layer bounds the body's
// bytes; these bound the work done per payload.
const (
	// ActivitiesMax is the most activities one payload may carry.
	ActivitiesMax = 10_000
	// EventIDLengthMax is the longest id Transfers derives; it leaves
	// room for the "reorg:" prefix of a compensation within the
	// payment_events.event_id bound of 256 characters.
	EventIDLengthMax = 250
	// LegacyEventIDPrefix started the event ids of Alchemy transfers before
	// ids came from the transfer alone (payment.Transfer.EventID); such
	// events still exist, so callers may not use it.
	LegacyEventIDPrefix = "alchemy:"
)

// ErrPayload marks a body that is not an Address Activity payload at all
// (not JSON, no event object, too many activities). A single activity that
// cannot be read is ignored instead, so it never blocks the others.
var ErrPayload = errors.New("malformed alchemy payload")

// Payload is a decoded webhook: the envelope plus its activities, still
// raw, because each one is judged on its own.
type Payload struct {
	WebhookID  string
	ID         string
	Type       string
	Network    string
	Activities []json.RawMessage
}

type envelope struct {
	WebhookID string          `json:"webhookId"`
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Event     json.RawMessage `json:"event"`
}

type event struct {
	Network  string          `json:"network"`
	Activity json.RawMessage `json:"activity"`
}

// Decode reads the envelope of a webhook body. Unknown fields are
// tolerated everywhere: Alchemy adds fields over time.
func Decode(body []byte) (Payload, error) { return DecodeWithin(body, ActivitiesMax) }

// DecodeWithin is Decode with at most activitiesMax activities, for a
// route whose body limit is raised above the default.
func DecodeWithin(body []byte, activitiesMax int) (Payload, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Payload{}, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	if isNull(env.Event) {
		return Payload{}, fmt.Errorf("%w: no event object", ErrPayload)
	}
	var ev event
	if err := json.Unmarshal(env.Event, &ev); err != nil {
		return Payload{}, fmt.Errorf("%w: event: %w", ErrPayload, err)
	}
	p := Payload{WebhookID: env.WebhookID, ID: env.ID, Type: env.Type, Network: ev.Network}
	if isNull(ev.Activity) {
		// Alchemy sends errors (e.g. capacity exhausted) in an event
		// without activities; there is nothing to credit.
		return p, nil
	}
	if err := json.Unmarshal(ev.Activity, &p.Activities); err != nil {
		return Payload{}, fmt.Errorf("%w: activity is not an array: %w", ErrPayload, err)
	}
	if len(p.Activities) > activitiesMax {
		return Payload{}, fmt.Errorf("%w: %d activities, at most %d", ErrPayload, len(p.Activities), activitiesMax)
	}
	if p.Type == TypeAddressActivity && len(p.Activities) > 0 && !payment.ValidNetworkName(p.Network) {
		return Payload{}, fmt.Errorf("%w: network %q", ErrPayload, truncate(p.Network))
	}
	return p, nil
}

// Reasons only Alchemy gives (the others are payment's).
const (
	IgnoreNotAddressActivity  payment.IgnoreReason = "not_address_activity"
	IgnoreUnsupportedCategory payment.IgnoreReason = "unsupported_category"
	IgnoreContractMismatch    payment.IgnoreReason = "contract_mismatch"
)

// Reasons lists every reason Transfers gives, for metrics and tests.
var Reasons = []payment.IgnoreReason{
	IgnoreNotAddressActivity, payment.IgnoreMalformed, payment.IgnoreNFT,
	IgnoreUnsupportedCategory, payment.IgnoreUnknownAsset,
	IgnoreContractMismatch, payment.IgnoreZeroAmount,
	payment.IgnoreAmountOutOfRange,
}

// Assets is what Transfers needs from the asset registry.
type Assets interface {
	Native(network string) (payment.Asset, bool)
	ByContract(network, contract string) (payment.Asset, bool)
}

// Transfers judges every activity of p: a fungible transfer of a known
// asset becomes a reported transfer (its amount rawContract.rawValue /
// 10^decimals exactly, the float "value" never read; Removed from the
// log's removed flag); anything else is ignored with its reason. The
// caller still has to find the recipient among the deposit addresses.
func Transfers(p Payload, assets Assets) ([]payment.ReportedTransfer, []payment.Ignored) {
	var transfers []payment.ReportedTransfer
	var ignored []payment.Ignored
	for i, raw := range p.Activities {
		if p.Type != TypeAddressActivity {
			ignored = append(ignored, payment.Ignored{Index: i, Reason: IgnoreNotAddressActivity})
			continue
		}
		t, reason := transfer(p.Network, raw, assets)
		if reason != "" {
			ignored = append(ignored, payment.Ignored{Index: i, Reason: reason})
			continue
		}
		transfers = append(transfers, t)
	}
	return transfers, ignored
}

type rawContract struct {
	RawValue *string `json:"rawValue"`
	Address  *string `json:"address"`
}

type activityLog struct {
	Address         *string `json:"address"`
	TransactionHash *string `json:"transactionHash"`
	LogIndex        *string `json:"logIndex"`
	BlockHash       *string `json:"blockHash"`
	Removed         bool    `json:"removed"`
}

type activity struct {
	Hash             string          `json:"hash"`
	ToAddress        string          `json:"toAddress"`
	Category         string          `json:"category"`
	ERC721TokenID    json.RawMessage `json:"erc721TokenId"`
	ERC1155Metadata  json.RawMessage `json:"erc1155Metadata"`
	RawContract      *rawContract    `json:"rawContract"`
	TypeTraceAddress *string         `json:"typeTraceAddress"`
	Log              *activityLog    `json:"log"`
}

// Activity categories settle credits.
const (
	kindExternal = "external"
	kindInternal = "internal"
	kindToken    = "token"
)

func transfer(network string, raw json.RawMessage, assets Assets) (payment.ReportedTransfer, payment.IgnoreReason) {
	var a activity
	if err := json.Unmarshal(raw, &a); err != nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	category := strings.ToLower(a.Category)
	// NFTs are never credited, whatever else the activity says.
	if !isNull(a.ERC721TokenID) || !isNull(a.ERC1155Metadata) ||
		category == "erc721" || category == "erc1155" || category == "specialnft" ||
		(a.RawContract != nil && a.RawContract.RawValue != nil && strings.EqualFold(*a.RawContract.RawValue, "0x")) {
		return payment.ReportedTransfer{}, payment.IgnoreNFT
	}
	txHash, ok := normalizeTxHash(a.Hash)
	if !ok && a.Hash == "" && a.Log != nil && a.Log.TransactionHash != nil {
		txHash, ok = normalizeTxHash(*a.Log.TransactionHash)
	}
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	if a.Log != nil && a.Log.TransactionHash != nil && !strings.EqualFold(*a.Log.TransactionHash, txHash) {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	to, ok := normalizeAddress(a.ToAddress)
	if !ok || a.RawContract == nil || a.RawContract.RawValue == nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	contract := ""
	if a.RawContract.Address != nil {
		contract = *a.RawContract.Address
	}

	var index string
	var asset payment.Asset
	switch category {
	case kindExternal, kindInternal:
		// The native coin carries no contract; one that names a contract
		// is not what its category claims.
		if contract != "" {
			return payment.ReportedTransfer{}, IgnoreContractMismatch
		}
		index = payment.TransferNative
		if category == kindInternal {
			if a.TypeTraceAddress == nil || !payment.ValidTraceAddress(*a.TypeTraceAddress) {
				return payment.ReportedTransfer{}, payment.IgnoreMalformed
			}
			index = payment.TraceTransfer(*a.TypeTraceAddress)
		}
		if asset, ok = assets.Native(network); !ok {
			return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset
		}
	case kindToken, "erc20":
		if a.Log == nil || a.Log.LogIndex == nil {
			return payment.ReportedTransfer{}, payment.IgnoreMalformed
		}
		logIndex, ok := payment.ParseQuantity(*a.Log.LogIndex)
		if !ok {
			return payment.ReportedTransfer{}, payment.IgnoreMalformed
		}
		index = payment.LogIndexTransfer(logIndex)
		normalized, ok := normalizeAddress(contract)
		if !ok {
			return payment.ReportedTransfer{}, payment.IgnoreMalformed
		}
		// The log is what the chain emitted; a payload whose contract
		// and log disagree is not trusted.
		if a.Log.Address != nil && !strings.EqualFold(*a.Log.Address, normalized) {
			return payment.ReportedTransfer{}, IgnoreContractMismatch
		}
		// A token is recognised by its contract, never by its symbol.
		if asset, ok = assets.ByContract(network, normalized); !ok {
			return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset
		}
	default:
		return payment.ReportedTransfer{}, IgnoreUnsupportedCategory
	}

	amount, err := money.FromBaseUnits(*a.RawContract.RawValue, asset.Decimals)
	switch {
	case errors.Is(err, money.ErrNotPositive):
		return payment.ReportedTransfer{}, payment.IgnoreZeroAmount
	case errors.Is(err, money.ErrTooLarge):
		return payment.ReportedTransfer{}, payment.IgnoreAmountOutOfRange
	case err != nil:
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	t := payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: network, TxHash: txHash, Index: index},
		ToAddress: to,
		Asset:     asset,
		Amount:    amount,
	}
	if a.Log != nil {
		t.Removed = a.Log.Removed
		// A block hash that is no hash is not read: the report then
		// counts as one that names no block.
		if a.Log.BlockHash != nil {
			t.BlockHash, _ = payment.NormalizeHex(*a.Log.BlockHash, 64)
		}
	}
	return t, ""
}

func isNull(raw json.RawMessage) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null"))
}

func normalizeTxHash(s string) (string, bool) { return payment.NormalizeHex(s, 64) }

func normalizeAddress(s string) (string, bool) { return payment.NormalizeHex(s, 40) }

// NormalizeAddress checks a 0x + 40 hex address in any letter case and
// returns it lowercase.
func NormalizeAddress(s string) (string, bool) { return normalizeAddress(s) }

// NormalizeTxHash checks a 0x + 64 hex transaction hash in any letter
// case and returns it lowercase.
func NormalizeTxHash(s string) (string, bool) { return normalizeTxHash(s) }

// ValidNetwork reports whether s is a network name like ETH_MAINNET.
func ValidNetwork(s string) bool { return payment.ValidNetworkName(s) }

// truncateLengthMax bounds outside text quoted in an error.
const truncateLengthMax = 64

func truncate(s string) string {
	if len(s) <= truncateLengthMax {
		return s
	}
	return s[:truncateLengthMax] + "…"
}
