package quicknode_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/quicknode"
)

// FuzzQuickNodeDecode: whatever comes in, nothing panics, every
// candidate ends a transfer or ignored, and a transfer is something the
// ledger can store (a positive in-range amount of a registered asset, in
// its decimals; lowercase hash and recipient; the transfer identity's id).
func FuzzQuickNodeDecode(f *testing.F) {
	f.Add([]byte(`{"data":[[` + transferLog(txToken, "0x0", "0x10", "6acfc0") + `]],"metadata":{"network":"ethereum-mainnet","dataset":"logs","blocks_reorged":[16]}}`))
	f.Add([]byte(`{"data":[{"block":{"number":"0x1","transactions":[{"hash":"` + txNative + `","to":"` + to + `","value":"0x1"}]},"receipts":[{"transactionHash":"` + txNative + `","status":"0x1","logs":[]}]}],"metadata":{"network":"ethereum-mainnet","dataset":"block_with_receipts"}}`))
	f.Add([]byte(`{"data":[[{"status":"0x1","logs":[{}]}]],"metadata":{"network":"base-mainnet","dataset":"receipts"}}`))
	f.Add([]byte(`{"data":null,"metadata":{}}`))
	reg := registry()
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := quicknode.Decode(body)
		if err != nil {
			return
		}
		transfers, ignored := quicknode.Transfers(p, reg)
		if len(transfers)+len(ignored) != p.Candidates() {
			t.Fatalf("%d candidates, %d transfers, %d ignored", p.Candidates(), len(transfers), len(ignored))
		}
		for _, i := range ignored {
			if !slices.Contains(quicknode.Reasons, i.Reason) {
				t.Fatalf("reason %q is not in quicknode.Reasons, the metric's labels", i.Reason)
			}
		}
		for _, tr := range transfers {
			if len(tr.EventID()) > 250 {
				t.Fatalf("event id %q", tr.EventID())
			}
			if index, err := payment.ParseTransferIndex(tr.Index); err != nil || index != tr.Index {
				t.Fatalf("index %q: %v", tr.Index, err)
			}
			if err := money.CheckRange(tr.Amount); err != nil || !tr.Amount.IsPositive() {
				t.Fatalf("amount %s: %v", tr.Amount, err)
			}
			if _, ok := money.ToBaseUnits(tr.Amount, tr.Asset.Decimals); !ok {
				t.Fatalf("amount %s finer than %d decimals", tr.Amount, tr.Asset.Decimals)
			}
			registered, ok := reg.Native(tr.Network)
			if tr.Asset.Contract != "" {
				registered, ok = reg.ByContract(tr.Network, tr.Asset.Contract)
			}
			if !ok || registered != tr.Asset {
				t.Fatalf("asset %+v", tr.Asset)
			}
			if tr.ToAddress != strings.ToLower(tr.ToAddress) || len(tr.ToAddress) != 42 || tr.TxHash != strings.ToLower(tr.TxHash) || len(tr.TxHash) != 66 {
				t.Fatalf("recipient %q, hash %q", tr.ToAddress, tr.TxHash)
			}
		}
	})
}

// FuzzQuickNodeVerify: a signature made with the token verifies in either
// letter case; any change of a byte of the signature, or of the body,
// makes it fail.
func FuzzQuickNodeVerify(f *testing.F) {
	f.Add("nonce", "1700000000", []byte(`{"data":[]}`), []byte(token), uint8(0))
	f.Add("n", "0", []byte{}, []byte("k"), uint8(63))
	f.Fuzz(func(t *testing.T, nonce, timestamp string, body, key []byte, position uint8) {
		sig := quicknode.Sign(nonce, timestamp, body, key)
		valid := nonce != "" && len(nonce) <= quicknode.NonceLengthMax && quicknode.Fresh(timestamp, timeOf(timestamp), 0)
		if quicknode.Verify(nonce, timestamp, body, sig, key) != valid || quicknode.Verify(nonce, timestamp, body, strings.ToUpper(sig), key) != valid {
			t.Fatalf("own signature: want %v", valid)
		}
		if !valid {
			return
		}
		i := int(position) % len(sig)
		flipped := []byte(sig)
		flipped[i] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", sig[i])+1)%16]
		if quicknode.Verify(nonce, timestamp, body, string(flipped), key) {
			t.Fatal("a changed signature verifies")
		}
		if quicknode.Verify(nonce, timestamp, append(body, position), sig, key) {
			t.Fatal("a changed body verifies")
		}
	})
}
