package moralis

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// Bounds on what one delivery may hold. The HTTP layer bounds the bytes;
// these bound the work done per delivery.
const (
	// ItemsMax is the most txs, txsInternal and erc20Transfers one
	// delivery may carry altogether.
	ItemsMax = 10_000
	// chainIDHexDigitsMax: chain ids fit an int64 (EIP-2294 keeps them far
	// smaller).
	chainIDHexDigitsMax = 15
	// valueDigitsMax is the most decimal digits of a uint256.
	valueDigitsMax = 78
	// logIndexDigitsMax: a log index is a uint64.
	logIndexDigitsMax = 20
)

// ErrPayload marks a body that is not a Streams delivery settle can read
// at all. A single transfer that cannot be read is ignored instead.
var ErrPayload = errors.New("malformed moralis payload")

// Payload is a decoded delivery: the envelope and its candidates, still
// raw, because each one is judged on its own.
type Payload struct {
	ChainID   int64
	Confirmed bool
	StreamID  string
	// BlockHash is the delivery's block (0x and 64 lowercase hex digits),
	// "" when it names none that reads.
	BlockHash string
	// Test marks the delivery Moralis sends when a stream is created or
	// updated: empty chain id, block and arrays. It must be answered 200
	// and carries nothing.
	Test bool

	erc20    []json.RawMessage
	txs      []json.RawMessage
	internal []json.RawMessage
}

// Candidates is how many items of the delivery could be transfers: every
// one ends as a Transfer or as Ignored.
func (p Payload) Candidates() int { return len(p.erc20) + len(p.txs) + len(p.internal) }

type envelope struct {
	Confirmed      bool              `json:"confirmed"`
	ChainID        *string           `json:"chainId"`
	StreamID       string            `json:"streamId"`
	Block          *blockView        `json:"block"`
	Txs            []json.RawMessage `json:"txs"`
	TxsInternal    []json.RawMessage `json:"txsInternal"`
	ERC20Transfers []json.RawMessage `json:"erc20Transfers"`
}

type blockView struct {
	Number string `json:"number"`
	Hash   string `json:"hash"`
}

// Decode reads a delivery's envelope. Unknown fields are tolerated
// everywhere: Moralis adds fields over time.
func Decode(body []byte) (Payload, error) { return DecodeWithin(body, ItemsMax) }

// DecodeWithin is Decode with at most itemsMax items, for a route whose
// body limit is raised above the default.
func DecodeWithin(body []byte, itemsMax int) (Payload, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Payload{}, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	p := Payload{Confirmed: env.Confirmed, StreamID: env.StreamID, erc20: env.ERC20Transfers, txs: env.Txs, internal: env.TxsInternal}
	if n := p.Candidates(); n > itemsMax {
		return Payload{}, fmt.Errorf("%w: %d items, at most %d", ErrPayload, n, itemsMax)
	}
	chain := ""
	if env.ChainID != nil {
		chain = *env.ChainID
	}
	if chain == "" && p.Candidates() == 0 && (env.Block == nil || env.Block.Number == "") {
		p.Test = true
		return p, nil
	}
	id, ok := parseChainID(chain)
	if !ok {
		return Payload{}, fmt.Errorf("%w: chainId %q", ErrPayload, truncate(chain))
	}
	p.ChainID = id
	if env.Block != nil {
		// Every transfer of a delivery is in its block: named, so that
		// where no chain can be asked, a late delivery of a block another
		// provider reported removed is stale, not a re-add.
		p.BlockHash, _ = payment.NormalizeHex(env.Block.Hash, 64)
	}
	return p, nil
}

// Reasons only Moralis gives (the others are payment's).
const (
	// IgnoreInternal: ETH moved by a contract call. Moralis gives no trace
	// address, so the transfer cannot be named as the others name it;
	// the scanner or Alchemy report those.
	IgnoreInternal payment.IgnoreReason = "internal_unsupported"
)

// Reasons lists every reason Transfers gives, for metrics and tests.
var Reasons = []payment.IgnoreReason{
	payment.IgnoreMalformed, payment.IgnoreUnknownNetwork,
	payment.IgnoreUnknownAsset, payment.IgnoreZeroAmount,
	payment.IgnoreAmountOutOfRange, payment.IgnoreNoReceipt,
	payment.IgnoreFailed, IgnoreInternal,
}

// Assets is what Transfers needs from the asset registry.
type Assets interface {
	Native(network string) (payment.Asset, bool)
	ByContract(network, contract string) (payment.Asset, bool)
}

// Chains names the network of a chain id (ETH_MAINNET for 1).
type Chains interface {
	NetworkOf(chainID int64) (string, bool)
}

// Transfers judges every candidate of p: ERC-20 transfers first, then
// native transactions, then internal ones (always ignored). An amount is
// the raw integer value over 10^decimals of the registered asset,
// exactly (valueWithDecimals and tokenDecimals are never read); the
// unconfirmed and the confirmed delivery name the same transfers.
func Transfers(p Payload, assets Assets, chains Chains) ([]payment.ReportedTransfer, []payment.Ignored) {
	var transfers []payment.ReportedTransfer
	var ignored []payment.Ignored
	network, known := "", false
	if !p.Test {
		network, known = chains.NetworkOf(p.ChainID)
	}
	judge := func(i int, t payment.ReportedTransfer, reason payment.IgnoreReason) {
		if reason == "" && !known {
			reason = payment.IgnoreUnknownNetwork
		}
		if reason != "" {
			ignored = append(ignored, payment.Ignored{Index: i, Reason: reason})
			return
		}
		t.BlockHash = p.BlockHash
		transfers = append(transfers, t)
	}
	i := 0
	for _, raw := range p.erc20 {
		t, reason := tokenTransfer(network, raw, assets)
		judge(i, t, reason)
		i++
	}
	for _, raw := range p.txs {
		t, reason, skip := nativeTransfer(network, raw, assets)
		if skip {
			// A transaction moving no value: no transfer at all, but it
			// is one of the candidates, so it is counted.
			reason = payment.IgnoreZeroAmount
		}
		judge(i, t, reason)
		i++
	}
	for range p.internal {
		judge(i, payment.ReportedTransfer{}, IgnoreInternal)
		i++
	}
	return transfers, ignored
}

type erc20View struct {
	TransactionHash *string         `json:"transactionHash"`
	LogIndex        json.RawMessage `json:"logIndex"`
	Contract        *string         `json:"contract"`
	To              *string         `json:"to"`
	Value           *string         `json:"value"`
}

func tokenTransfer(network string, raw json.RawMessage, assets Assets) (payment.ReportedTransfer, payment.IgnoreReason) {
	var v erc20View
	if err := json.Unmarshal(raw, &v); err != nil || v.TransactionHash == nil || v.Contract == nil || v.To == nil || v.Value == nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	txHash, ok := payment.NormalizeHex(*v.TransactionHash, 64)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	contract, ok := payment.NormalizeHex(*v.Contract, 40)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	to, ok := payment.NormalizeHex(*v.To, 40)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	logIndex, ok := parseLogIndex(v.LogIndex)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	if network == "" {
		return payment.ReportedTransfer{}, payment.IgnoreUnknownNetwork
	}
	// A token is recognised by its contract, never by its symbol.
	asset, ok := assets.ByContract(network, contract)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset
	}
	amount, reason := amountOf(*v.Value, asset)
	if reason != "" {
		return payment.ReportedTransfer{}, reason
	}
	index := payment.LogIndexTransfer(logIndex)
	return payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: network, TxHash: txHash, Index: index},
		ToAddress: to, Asset: asset, Amount: amount,
	}, ""
}

type txView struct {
	Hash          *string `json:"hash"`
	ToAddress     *string `json:"toAddress"`
	Value         *string `json:"value"`
	ReceiptStatus *string `json:"receiptStatus"`
}

// nativeTransfer judges a transaction's own value; skip reports a
// transaction that moves none (a contract call, an outgoing transfer's
// zero value): it is no transfer.
func nativeTransfer(network string, raw json.RawMessage, assets Assets) (payment.ReportedTransfer, payment.IgnoreReason, bool) {
	var v txView
	if err := json.Unmarshal(raw, &v); err != nil || v.Hash == nil || v.Value == nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed, false
	}
	if strings.Trim(*v.Value, "0") == "" && *v.Value != "" {
		return payment.ReportedTransfer{}, "", true
	}
	txHash, ok := payment.NormalizeHex(*v.Hash, 64)
	if !ok || v.ToAddress == nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed, false
	}
	to, ok := payment.NormalizeHex(*v.ToAddress, 40)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed, false
	}
	switch {
	case v.ReceiptStatus == nil || *v.ReceiptStatus == "":
		return payment.ReportedTransfer{}, payment.IgnoreNoReceipt, false
	case *v.ReceiptStatus != "1":
		return payment.ReportedTransfer{}, payment.IgnoreFailed, false
	case network == "":
		return payment.ReportedTransfer{}, payment.IgnoreUnknownNetwork, false
	}
	asset, ok := assets.Native(network)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset, false
	}
	amount, reason := amountOf(*v.Value, asset)
	if reason != "" {
		return payment.ReportedTransfer{}, reason, false
	}
	return payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: network, TxHash: txHash, Index: payment.TransferNative},
		ToAddress: to, Asset: asset, Amount: amount,
	}, "", false
}

// amountOf reads a decimal integer string (Moralis's value) as base
// units of asset.
func amountOf(value string, asset payment.Asset) (decimal.Decimal, payment.IgnoreReason) {
	if value == "" || len(value) > valueDigitsMax || !digitsOnly(value) {
		return decimal.Decimal{}, payment.IgnoreMalformed
	}
	units, _ := new(big.Int).SetString(value, 10)
	amount, err := money.FromBaseUnits("0x"+units.Text(16), asset.Decimals)
	switch {
	case errors.Is(err, money.ErrNotPositive):
		return decimal.Decimal{}, payment.IgnoreZeroAmount
	case errors.Is(err, money.ErrTooLarge):
		return decimal.Decimal{}, payment.IgnoreAmountOutOfRange
	case err != nil:
		return decimal.Decimal{}, payment.IgnoreMalformed
	}
	return amount, ""
}

// parseLogIndex reads logIndex as Moralis sends it: a decimal string, or
// a JSON number.
func parseLogIndex(raw json.RawMessage) (uint64, bool) {
	text := string(bytes.TrimSpace(raw))
	var s string
	if json.Unmarshal(raw, &s) == nil {
		text = s
	}
	if text == "" || len(text) > logIndexDigitsMax || !digitsOnly(text) || (len(text) > 1 && text[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseUint(text, 10, 64)
	return n, err == nil
}

// parseChainID reads "0x1" (Moralis's form) as 1.
func parseChainID(s string) (int64, bool) {
	if len(s) < 3 || len(s) > 2+chainIDHexDigitsMax || (s[:2] != "0x" && s[:2] != "0X") {
		return 0, false
	}
	n, err := strconv.ParseInt(s[2:], 16, 64)
	return n, err == nil && n > 0
}

func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// truncateLengthMax bounds outside text quoted in an error.
const truncateLengthMax = 64

func truncate(s string) string {
	if len(s) <= truncateLengthMax {
		return s
	}
	return s[:truncateLengthMax] + "…"
}
