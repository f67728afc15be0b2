package quicknode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// Datasets settle reads. Any other dataset is acknowledged and ignored:
// it carries nothing a deposit can be proven from (a transaction's value
// without its receipt's status, for one).
const (
	DatasetBlockWithReceipts = "block_with_receipts"
	DatasetReceipts          = "receipts"
	DatasetLogs              = "logs"
)

// TransferTopic is topic 0 of an ERC-20 (and ERC-721) Transfer log:
// keccak256("Transfer(address,address,uint256)").
const TransferTopic = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"

// Bounds on what one delivery may hold. The HTTP layer bounds the bytes
// (after decompression); these bound the work done per delivery.
const (
	// ItemsMax is the most blocks, transactions, receipts and logs one
	// delivery may carry altogether.
	ItemsMax = 20_000
	// ReorgedMax bounds metadata.blocks_reorged.
	ReorgedMax = 10_000
	// networkLengthMax bounds QuickNode's network name.
	networkLengthMax = 64
)

// networks maps QuickNode's network names to settle's. QuickNode calls
// Polygon PoS polygon-mainnet; matic-mainnet is its older name.
var networks = map[string]string{
	"ethereum-mainnet": "ETH_MAINNET",
	"ethereum-sepolia": "ETH_SEPOLIA",
	"base-mainnet":     "BASE_MAINNET",
	"base-sepolia":     "BASE_SEPOLIA",
	"arbitrum-mainnet": "ARB_MAINNET",
	"optimism-mainnet": "OPT_MAINNET",
	"polygon-mainnet":  "MATIC_MAINNET",
	"matic-mainnet":    "MATIC_MAINNET",
}

// Network is settle's name for a QuickNode network name: the table's,
// else the name itself upper-cased with '-' as '_' ("bsc-mainnet" is
// BSC_MAINNET), so a network an operator adds under that name at run time
// is fed without a release. Whether settle lists it is the registry's
// answer (Transfers).
func Network(streamNetwork string) (string, bool) {
	if n, ok := networks[streamNetwork]; ok {
		return n, true
	}
	n := strings.ToUpper(strings.ReplaceAll(streamNetwork, "-", "_"))
	if !payment.ValidNetworkName(n) {
		return "", false
	}
	return n, true
}

// ErrPayload marks a body that is not a Streams delivery settle can read
// at all (not JSON, no metadata, data not shaped as its dataset, too many
// items). A single item that cannot be read is ignored instead.
var ErrPayload = errors.New("malformed quicknode payload")

// Payload is a decoded delivery: its metadata and the candidates found
// in its data, each still raw, because each one is judged on its own.
type Payload struct {
	// StreamNetwork is QuickNode's name; Network settle's ("" when it
	// maps to none).
	StreamNetwork string
	Network       string
	Dataset       string
	// Reorged holds the blocks QuickNode says it sends because of a reorg.
	Reorged map[uint64]bool

	candidates []candidate
}

// Candidates is how many items of the delivery could be transfers: every
// one ends as a Transfer or as Ignored.
func (p Payload) Candidates() int { return len(p.candidates) }

type candidateKind int

const (
	kindLog candidateKind = iota
	kindNative
	// kindBroken: a receipt or transaction that could not be read, so its
	// transfers cannot be judged.
	kindBroken
)

type candidate struct {
	kind candidateKind
	raw  json.RawMessage
	// For a native transfer: its block's number and hash ("" when the
	// block names none that reads) and its receipt's status (nil: no
	// receipt in the delivery).
	block     uint64
	blockHash string
	status    *string
}

type envelope struct {
	Data     json.RawMessage `json:"data"`
	Metadata *metadata       `json:"metadata"`
}

type metadata struct {
	Network       string            `json:"network"`
	Dataset       string            `json:"dataset"`
	BlocksReorged []json.RawMessage `json:"blocks_reorged"`
}

// Decode reads a delivery's metadata and the shape of its data. Unknown
// fields are tolerated everywhere.
func Decode(body []byte) (Payload, error) { return DecodeWithin(body, ItemsMax) }

// DecodeWithin is Decode with at most itemsMax items, for a route whose
// body limit is raised above the default.
func DecodeWithin(body []byte, itemsMax int) (Payload, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Payload{}, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	if env.Metadata == nil {
		return Payload{}, fmt.Errorf("%w: no metadata object (deliver the stream's metadata in the body)", ErrPayload)
	}
	md := env.Metadata
	if len(md.Network) > networkLengthMax {
		return Payload{}, fmt.Errorf("%w: network name of %d bytes", ErrPayload, len(md.Network))
	}
	if len(md.BlocksReorged) > ReorgedMax {
		return Payload{}, fmt.Errorf("%w: %d reorged blocks, at most %d", ErrPayload, len(md.BlocksReorged), ReorgedMax)
	}
	p := Payload{StreamNetwork: md.Network, Dataset: md.Dataset, Reorged: map[uint64]bool{}}
	p.Network, _ = Network(md.Network)
	for _, raw := range md.BlocksReorged {
		n, ok := blockNumber(raw)
		if !ok {
			return Payload{}, fmt.Errorf("%w: blocks_reorged holds %s", ErrPayload, truncate(string(raw)))
		}
		p.Reorged[n] = true
	}
	if isNull(env.Data) {
		return p, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(env.Data, &items); err != nil {
		return Payload{}, fmt.Errorf("%w: data is not an array: %w", ErrPayload, err)
	}
	d := decoder{p: &p, itemsMax: itemsMax}
	switch md.Dataset {
	case DatasetBlockWithReceipts:
		for _, item := range items {
			if err := d.blockWithReceipts(item); err != nil {
				return Payload{}, err
			}
		}
	case DatasetReceipts:
		for _, item := range items {
			if err := d.nested(item, d.receipt); err != nil {
				return Payload{}, err
			}
		}
	case DatasetLogs:
		for _, item := range items {
			if err := d.nested(item, d.log); err != nil {
				return Payload{}, err
			}
		}
	}
	return p, nil
}

type decoder struct {
	p        *Payload
	items    int
	itemsMax int
}

// count charges n items against the delivery's bound.
func (d *decoder) count(n int) error {
	d.items += n
	if d.items > d.itemsMax {
		return fmt.Errorf("%w: more than %d items", ErrPayload, d.itemsMax)
	}
	return nil
}

// nested reads one element of data: an array of the dataset's items for
// one block (what QuickNode sends), or a single item.
func (d *decoder) nested(item json.RawMessage, one func(json.RawMessage) error) error {
	if err := d.count(1); err != nil {
		return err
	}
	trimmed := bytes.TrimSpace(item)
	if len(trimmed) == 0 || trimmed[0] != '[' {
		return one(item)
	}
	var inner []json.RawMessage
	if err := json.Unmarshal(item, &inner); err != nil {
		return fmt.Errorf("%w: %w", ErrPayload, err)
	}
	for _, raw := range inner {
		if err := one(raw); err != nil {
			return err
		}
	}
	return nil
}

type receiptView struct {
	TransactionHash *string           `json:"transactionHash"`
	Status          *string           `json:"status"`
	Logs            []json.RawMessage `json:"logs"`
}

// receipt adds a receipt's logs. A receipt of a failed transaction holds
// no logs; its status is checked anyway, the chain's word over the
// provider's.
func (d *decoder) receipt(raw json.RawMessage) error {
	if err := d.count(1); err != nil {
		return err
	}
	if isNull(raw) {
		return nil
	}
	var r receiptView
	if err := json.Unmarshal(raw, &r); err != nil {
		d.p.candidates = append(d.p.candidates, candidate{kind: kindBroken})
		return nil
	}
	if r.Status == nil || !strings.EqualFold(*r.Status, "0x1") {
		return nil
	}
	for _, l := range r.Logs {
		if err := d.log(l); err != nil {
			return err
		}
	}
	return nil
}

// log adds a log when it is a Transfer log (topic 0); any other log is no
// transfer and is not counted.
func (d *decoder) log(raw json.RawMessage) error {
	if err := d.count(1); err != nil {
		return err
	}
	var head struct {
		Topics []json.RawMessage `json:"topics"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		d.p.candidates = append(d.p.candidates, candidate{kind: kindBroken})
		return nil
	}
	if len(head.Topics) == 0 {
		return nil
	}
	var topic string
	if err := json.Unmarshal(head.Topics[0], &topic); err != nil || !strings.EqualFold(topic, TransferTopic) {
		return nil
	}
	d.p.candidates = append(d.p.candidates, candidate{kind: kindLog, raw: raw})
	return nil
}

type blockView struct {
	Number       *string           `json:"number"`
	Hash         *string           `json:"hash"`
	Transactions []json.RawMessage `json:"transactions"`
}

type txView struct {
	Hash  *string `json:"hash"`
	To    *string `json:"to"`
	Value *string `json:"value"`
}

// blockWithReceipts reads one {"block", "receipts"} element: the block's
// transactions that carry value are native candidates, judged with their
// receipt's status; the receipts' logs are token candidates.
func (d *decoder) blockWithReceipts(item json.RawMessage) error {
	if err := d.count(1); err != nil {
		return err
	}
	var bwr struct {
		Block    json.RawMessage   `json:"block"`
		Receipts []json.RawMessage `json:"receipts"`
	}
	if err := json.Unmarshal(item, &bwr); err != nil {
		return fmt.Errorf("%w: block_with_receipts element: %w", ErrPayload, err)
	}
	statuses := map[string]*string{}
	for _, raw := range bwr.Receipts {
		if err := d.receipt(raw); err != nil {
			return err
		}
		var r receiptView
		if json.Unmarshal(raw, &r) == nil && r.TransactionHash != nil && r.Status != nil {
			statuses[strings.ToLower(*r.TransactionHash)] = r.Status
		}
	}
	if isNull(bwr.Block) {
		return nil
	}
	var b blockView
	if err := json.Unmarshal(bwr.Block, &b); err != nil {
		d.p.candidates = append(d.p.candidates, candidate{kind: kindBroken})
		return nil
	}
	// A number that does not read is no block: block 0 would pass
	// every finality policy at once.
	var number uint64
	numbered := false
	if b.Number != nil {
		number, numbered = payment.ParseQuantity(*b.Number)
	}
	var hash string
	if b.Hash != nil {
		hash, _ = payment.NormalizeHex(*b.Hash, 64)
	}
	for _, raw := range b.Transactions {
		if err := d.count(1); err != nil {
			return err
		}
		var tx txView
		if err := json.Unmarshal(raw, &tx); err != nil {
			// A block with hashes only has no values to credit.
			var hash string
			if json.Unmarshal(raw, &hash) != nil {
				d.p.candidates = append(d.p.candidates, candidate{kind: kindBroken})
			}
			continue
		}
		// Contract creations and transactions moving no value are no
		// native transfers.
		if tx.To == nil || tx.Value == nil || isZeroQuantity(*tx.Value) {
			continue
		}
		var status *string
		if tx.Hash != nil {
			status = statuses[strings.ToLower(*tx.Hash)]
		}
		if !numbered {
			d.p.candidates = append(d.p.candidates, candidate{kind: kindBroken})
			continue
		}
		d.p.candidates = append(d.p.candidates, candidate{kind: kindNative, raw: raw, block: number, blockHash: hash, status: status})
	}
	return nil
}

// Reasons lists every reason Transfers gives, for metrics and tests.
var Reasons = []payment.IgnoreReason{
	payment.IgnoreMalformed, payment.IgnoreNFT, payment.IgnoreUnknownNetwork,
	payment.IgnoreUnknownAsset, payment.IgnoreZeroAmount,
	payment.IgnoreAmountOutOfRange, payment.IgnoreNoReceipt,
	payment.IgnoreFailed,
}

// Assets is what Transfers needs from the asset registry.
type Assets interface {
	Network(name string) (payment.Network, bool)
	Native(network string) (payment.Asset, bool)
	ByContract(network, contract string) (payment.Asset, bool)
}

// Transfers judges every candidate of p: a fungible transfer of a known
// asset becomes a reported transfer (its amount the log's data or the
// transaction's value over 10^decimals, exactly; Removed when the log
// says removed or its block is in blocks_reorged, Reorged when QuickNode
// sends it again on the new branch); anything else is ignored with its
// reason.
func Transfers(p Payload, assets Assets) ([]payment.ReportedTransfer, []payment.Ignored) {
	var transfers []payment.ReportedTransfer
	var ignored []payment.Ignored
	if p.Network != "" {
		if _, listed := assets.Network(p.Network); !listed {
			p.Network = "" // a name derived from QuickNode's that settle does not list
		}
	}
	for i, c := range p.candidates {
		var t payment.ReportedTransfer
		var reason payment.IgnoreReason
		switch {
		case c.kind == kindBroken:
			reason = payment.IgnoreMalformed
		case p.Network == "":
			reason = payment.IgnoreUnknownNetwork
		case c.kind == kindLog:
			t, reason = logTransfer(p, c.raw, assets)
		default:
			t, reason = nativeTransfer(p, c, assets)
		}
		if reason != "" {
			ignored = append(ignored, payment.Ignored{Index: i, Reason: reason})
			continue
		}
		transfers = append(transfers, t)
	}
	return transfers, ignored
}

type logView struct {
	Address         *string  `json:"address"`
	Topics          []string `json:"topics"`
	Data            *string  `json:"data"`
	BlockNumber     *string  `json:"blockNumber"`
	BlockHash       *string  `json:"blockHash"`
	TransactionHash *string  `json:"transactionHash"`
	LogIndex        *string  `json:"logIndex"`
	Removed         bool     `json:"removed"`
}

// Topic and data lengths of an ERC-20 Transfer log: three topics (the
// signature, from, to), the value as one 32-byte word.
const (
	erc20Topics   = 3
	erc721Topics  = 4
	wordHexDigits = 64
)

func logTransfer(p Payload, raw json.RawMessage, assets Assets) (payment.ReportedTransfer, payment.IgnoreReason) {
	var l logView
	if err := json.Unmarshal(raw, &l); err != nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	switch {
	case len(l.Topics) == erc721Topics:
		// ERC-721's Transfer indexes the token id too: never credited.
		return payment.ReportedTransfer{}, payment.IgnoreNFT
	case len(l.Topics) != erc20Topics || l.Address == nil || l.Data == nil ||
		l.TransactionHash == nil || l.LogIndex == nil || l.BlockNumber == nil:
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	contract, ok := payment.NormalizeHex(*l.Address, 40)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	txHash, ok := payment.NormalizeHex(*l.TransactionHash, 64)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	logIndex, ok := payment.ParseQuantity(*l.LogIndex)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	block, ok := payment.ParseQuantity(*l.BlockNumber)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	to, ok := topicAddress(l.Topics[2])
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	word, ok := payment.NormalizeHex(*l.Data, wordHexDigits)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	// A token is recognised by its contract, never by its symbol.
	asset, ok := assets.ByContract(p.Network, contract)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset
	}
	amount, reason := amountOf(word, asset)
	if reason != "" {
		return payment.ReportedTransfer{}, reason
	}
	index := payment.LogIndexTransfer(logIndex)
	t := payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: p.Network, TxHash: txHash, Index: index},
		ToAddress: to, Asset: asset, Amount: amount,
		Removed: l.Removed || p.Reorged[block], Reorged: !l.Removed && p.Reorged[block],
	}
	if l.BlockHash != nil {
		t.BlockHash = reportedBlock(t, *l.BlockHash)
	}
	return t, ""
}

// reportedBlock is the block a report names for the intake to weigh it
// with the transfer's other reports (where no chain can be asked): a
// delivery of a block another provider reported removed is then stale,
// not a re-add. A transfer sent again because of blocks_reorged names
// none: that block is the reorg's new branch, not one taken away, and
// such a report is handled as a removal without a block, as before.
func reportedBlock(t payment.ReportedTransfer, hash string) string {
	if t.Reorged {
		return ""
	}
	normalized, _ := payment.NormalizeHex(hash, 64)
	return normalized
}

func nativeTransfer(p Payload, c candidate, assets Assets) (payment.ReportedTransfer, payment.IgnoreReason) {
	var tx txView
	if err := json.Unmarshal(c.raw, &tx); err != nil || tx.Hash == nil {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	txHash, ok := payment.NormalizeHex(*tx.Hash, 64)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	to, ok := payment.NormalizeHex(*tx.To, 40)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreMalformed
	}
	switch {
	case c.status == nil:
		return payment.ReportedTransfer{}, payment.IgnoreNoReceipt
	case !strings.EqualFold(*c.status, "0x1"):
		return payment.ReportedTransfer{}, payment.IgnoreFailed
	}
	asset, ok := assets.Native(p.Network)
	if !ok {
		return payment.ReportedTransfer{}, payment.IgnoreUnknownAsset
	}
	amount, reason := amountOf(*tx.Value, asset)
	if reason != "" {
		return payment.ReportedTransfer{}, reason
	}
	t := payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: p.Network, TxHash: txHash, Index: payment.TransferNative},
		ToAddress: to, Asset: asset, Amount: amount,
		Removed: p.Reorged[c.block], Reorged: p.Reorged[c.block],
	}
	t.BlockHash = reportedBlock(t, c.blockHash)
	return t, ""
}

// amountOf reads a hex quantity or a 32-byte word as base units of asset.
func amountOf(hex string, asset payment.Asset) (decimal.Decimal, payment.IgnoreReason) {
	if len(hex) < 3 || (hex[:2] != "0x" && hex[:2] != "0X") {
		return decimal.Decimal{}, payment.IgnoreMalformed
	}
	// Leading zeros (a 32-byte word has many) are not digits of the value.
	digits := strings.TrimLeft(hex[2:], "0")
	if digits == "" {
		digits = "0"
	}
	amount, err := money.FromBaseUnits("0x"+digits, asset.Decimals)
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

// topicAddress reads an address from an indexed topic: 12 zero bytes,
// then the 20 bytes of the address.
func topicAddress(topic string) (string, bool) {
	word, ok := payment.NormalizeHex(topic, wordHexDigits)
	if !ok || strings.Trim(word[2:26], "0") != "" {
		return "", false
	}
	return "0x" + word[26:], true
}

func isNull(raw json.RawMessage) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null"))
}

func isZeroQuantity(s string) bool {
	if len(s) < 2 || (s[:2] != "0x" && s[:2] != "0X") {
		return false
	}
	return strings.Trim(s[2:], "0") == ""
}

// blockNumber reads a block number as QuickNode lists it: a JSON number,
// or a hex quantity or decimal string.
func blockNumber(raw json.RawMessage) (uint64, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if n, ok := payment.ParseQuantity(s); ok {
			return n, true
		}
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(raw)), 10, 64)
	return n, err == nil
}

// truncateLengthMax bounds outside text quoted in an error.
const truncateLengthMax = 64

func truncate(s string) string {
	if len(s) <= truncateLengthMax {
		return s
	}
	return s[:truncateLengthMax] + "…"
}
