package chain

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzFullBlock: a node's eth_getBlockByNumber answer never panics the
// parser, and what it accepts has well-formed hashes, recipients and
// non-negative values.
func FuzzFullBlock(f *testing.F) {
	f.Add([]byte(`{"number":"0x2","hash":"0x` + strings.Repeat("ab", 32) + `","parentHash":"0x` + strings.Repeat("ef", 32) + `","transactions":[{"hash":"0x` + strings.Repeat("cd", 32) + `","to":"0x` + strings.Repeat("11", 20) + `","value":"0x5"}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"number":"0x2","hash":"0x` + strings.Repeat("ab", 32) + `","transactions":["0x` + strings.Repeat("cd", 32) + `"]}`))
	f.Add([]byte(`{"number":"0x2","hash":"0x` + strings.Repeat("AB", 32) + `","parentHash":"0X` + strings.Repeat("eF", 32) + `","transactions":[{"hash":"0x` + strings.Repeat("Cd", 32) + `","to":"0x` + strings.Repeat("1A", 20) + `","value":"0x5"}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := parseFullBlock(raw)
		if err != nil {
			return
		}
		// One spelling (0x, lowercase): the scanner's event ids, and so
		// one credit per transfer, are built from these.
		if len(b.Hash) != hashHexLength || !canonicalHex(b.Hash) || (b.ParentHash != "" && (len(b.ParentHash) != hashHexLength || !canonicalHex(b.ParentHash))) {
			t.Fatalf("block hash %q, parent %q", b.Hash, b.ParentHash)
		}
		for _, tx := range b.Transactions {
			if len(tx.Hash) != hashHexLength || !canonicalHex(tx.Hash) || (tx.To != "" && (len(tx.To) != addressHexLength || !canonicalHex(tx.To))) ||
				tx.Value == nil || tx.Value.Sign() < 0 {
				t.Fatalf("accepted %+v", tx)
			}
		}
	})
}

// canonicalHex: 0x and lowercase hex digits only.
func canonicalHex(s string) bool {
	digits, ok := strings.CutPrefix(s, "0x")
	return ok && strings.Trim(digits, "0123456789abcdef") == ""
}

// FuzzReceiptStatus: a node's receipt never panics the parser, and a
// status it accepts is of that transaction in the block the pass read.
func FuzzReceiptStatus(f *testing.F) {
	tx, block := "0x"+strings.Repeat("cd", 32), "0x"+strings.Repeat("ab", 32)
	f.Add([]byte(`{"transactionHash":"`+tx+`","blockHash":"`+block+`","blockNumber":"0x2","status":"0x1"}`), true)
	f.Add([]byte(`{"transactionHash":"`+tx+`","blockHash":"0x`+strings.Repeat("ef", 32)+`","blockNumber":"0x2","status":"0x0"}`), false)
	f.Add([]byte(`null`), true)
	f.Fuzz(func(t *testing.T, raw []byte, byHash bool) {
		want := MinedTx{Hash: tx, BlockNumber: 2}
		if byHash {
			want.BlockHash = block
		}
		status, err := receiptStatus(raw, want)
		if err != nil {
			return
		}
		var r receiptStatusJSON
		if json.Unmarshal(raw, &r) != nil || !strings.EqualFold(*r.TransactionHash, tx) || *r.BlockNumber == "" ||
			(byHash && !strings.EqualFold(*r.BlockHash, block)) {
			t.Fatalf("accepted %q (status %d)", raw, status)
		}
		if n, err := parseQuantity(*r.BlockNumber); err != nil || n != 2 {
			t.Fatalf("accepted block number %q", *r.BlockNumber)
		}
	})
}
