package chain

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/settle/settle/pkg/payment"
)

// Lengths of the hex forms settle accepts, "0x" included.
const (
	hashHexLength    = 2 + 64
	addressHexLength = 2 + 40
)

// ParseTxHash checks a transaction hash (0x + 64 hex digits, any case) and
// returns it in lowercase, the form every settle table and key uses.
func ParseTxHash(s string) (string, error) {
	h, err := parseHex(s, hashHexLength, "transaction hash")
	if err != nil {
		return "", payment.Invalid("%w", err)
	}
	return h, nil
}

// ParseAddress checks an account or contract address (0x + 40 hex digits,
// any case; no checksum is required) and returns it in lowercase.
func ParseAddress(s string) (string, error) {
	a, err := parseHex(s, addressHexLength, "address")
	if err != nil {
		return "", payment.Invalid("%w", err)
	}
	return a, nil
}

// parseHex returns a plain error: when the input came from a node, a bad
// value is the node's fault, not an invalid deposit.
func parseHex(s string, length int, what string) (string, error) {
	if len(s) != length || (s[:2] != "0x" && s[:2] != "0X") {
		return "", fmt.Errorf("%s %q is not 0x and %d hex digits", what, s, length-2)
	}
	for i := 2; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return "", fmt.Errorf("%s %q is not 0x and %d hex digits", what, s, length-2)
		}
	}
	return "0x" + strings.ToLower(s[2:]), nil
}

func isHexDigit(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// Header is the part of a block header settle looks at.
type Header struct {
	Number uint64
	Hash   string // lowercase 0x hex, as the node reported it
	Time   uint64 // unix seconds
}

// blockJSON is the subset of eth_getBlockByNumber's answer we read. The
// hash is taken as the node reports it rather than recomputed from the
// header fields: a recomputed hash is wrong on any chain whose header
// carries fields this go-ethereum does not know, and a wrong hash would
// look exactly like a reorg.
type blockJSON struct {
	Number    *string `json:"number"`
	Hash      *string `json:"hash"`
	Timestamp *string `json:"timestamp"`
}

// parseHeader decodes an eth_getBlockByNumber result. A JSON null (no
// such block) is reported as ok=false.
func parseHeader(raw json.RawMessage) (h Header, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return Header{}, false, nil
	}
	var b blockJSON
	if err := json.Unmarshal(raw, &b); err != nil {
		return Header{}, false, fmt.Errorf("decode block: %w", err)
	}
	if b.Number == nil || b.Hash == nil || b.Timestamp == nil {
		return Header{}, false, fmt.Errorf("block lacks number, hash or timestamp")
	}
	if h.Number, err = parseQuantity(*b.Number); err != nil {
		return Header{}, false, fmt.Errorf("block number: %w", err)
	}
	if h.Time, err = parseQuantity(*b.Timestamp); err != nil {
		return Header{}, false, fmt.Errorf("block timestamp: %w", err)
	}
	if h.Hash, err = parseHex(*b.Hash, hashHexLength, "block hash"); err != nil {
		return Header{}, false, err
	}
	return h, true, nil
}

// parseTxHashes reads the transaction hashes of a block asked for
// without full transactions, lowercased.
func parseTxHashes(raw json.RawMessage) ([]string, error) {
	var b struct {
		Transactions *[]string `json:"transactions"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, fmt.Errorf("decode block transactions: %w", err)
	}
	if b.Transactions == nil {
		return nil, errors.New("block lacks its transactions")
	}
	hashes := make([]string, 0, len(*b.Transactions))
	for _, t := range *b.Transactions {
		hash, err := parseHex(t, hashHexLength, "transaction hash")
		if err != nil {
			return nil, err
		}
		hashes = append(hashes, hash)
	}
	return hashes, nil
}

// parseQuantity reads a JSON-RPC QUANTITY (0x-prefixed hex, no leading
// zeros except 0x0) that must fit in 64 bits.
func parseQuantity(s string) (uint64, error) {
	digits, ok := strings.CutPrefix(s, "0x")
	if !ok || digits == "" || len(digits) > 16 || (len(digits) > 1 && digits[0] == '0') {
		return 0, fmt.Errorf("%q is not a hex quantity", s)
	}
	for i := 0; i < len(digits); i++ {
		if !isHexDigit(digits[i]) {
			return 0, fmt.Errorf("%q is not a hex quantity", s)
		}
	}
	return strconv.ParseUint(digits, 16, 64)
}

// topicAddress reads an indexed address parameter: a 32-byte topic whose
// first 12 bytes are zero.
func topicAddress(topic [32]byte) (string, bool) {
	for _, b := range topic[:12] {
		if b != 0 {
			return "", false
		}
	}
	return fmt.Sprintf("0x%x", topic[12:]), true
}

// wordValue reads one ABI uint256 word.
func wordValue(data []byte) (*big.Int, bool) {
	if len(data) != 32 {
		return nil, false
	}
	return new(big.Int).SetBytes(data), true
}

// Transaction is the part of a transaction settle checks a native deposit
// against: where its value went and how much it was.
type Transaction struct {
	To    string // lowercase 0x hex; empty for a contract creation
	Value *big.Int
}

// txJSON is the subset of eth_getTransactionByHash's answer we read.
type txJSON struct {
	To    *string `json:"to"`
	Value *string `json:"value"`
}

// parseTransaction decodes an eth_getTransactionByHash result. A JSON null
// (no such transaction) is reported as ok=false.
func parseTransaction(raw json.RawMessage) (tx Transaction, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return Transaction{}, false, nil
	}
	var t txJSON
	if err := json.Unmarshal(raw, &t); err != nil {
		return Transaction{}, false, fmt.Errorf("decode transaction: %w", err)
	}
	if t.Value == nil {
		return Transaction{}, false, fmt.Errorf("transaction lacks a value")
	}
	if tx.Value, err = hexutil.DecodeBig(*t.Value); err != nil {
		return Transaction{}, false, fmt.Errorf("transaction value %q: %w", *t.Value, err)
	}
	if t.To != nil {
		if tx.To, err = parseHex(*t.To, addressHexLength, "transaction recipient"); err != nil {
			return Transaction{}, false, err
		}
	}
	return tx, true, nil
}
