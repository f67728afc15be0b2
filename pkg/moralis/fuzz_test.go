package moralis_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/payment"
	"golang.org/x/crypto/sha3"
)

// FuzzMoralisDecode: whatever comes in, nothing panics, every candidate
// ends a transfer or ignored, and a transfer is something the ledger can
// store.
func FuzzMoralisDecode(f *testing.F) {
	f.Add([]byte(`{"confirmed":false,"chainId":"0x1","block":{"number":"1"},"erc20Transfers":[{"transactionHash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72","logIndex":"0","contract":"0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48","to":"0x1111111111111111111111111111111111111111","value":"7000000"}],"txs":[{"hash":"0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x1111111111111111111111111111111111111111","value":"1","receiptStatus":"1"}]}`))
	f.Add([]byte(`{"abi":{},"block":{"hash":"","number":"","timestamp":""},"txs":[],"chainId":"","confirmed":true,"erc20Transfers":[]}`))
	f.Add([]byte(`{"chainId":"0x2105","txsInternal":[{}],"txs":[{"value":"0"}]}`))
	reg := registry()
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := moralis.Decode(body)
		if err != nil {
			return
		}
		transfers, ignored := moralis.Transfers(p, reg, networks)
		if len(transfers)+len(ignored) != p.Candidates() {
			t.Fatalf("%d candidates, %d transfers, %d ignored", p.Candidates(), len(transfers), len(ignored))
		}
		for _, i := range ignored {
			if !slices.Contains(moralis.Reasons, i.Reason) {
				t.Fatalf("reason %q is not in moralis.Reasons, the metric's labels", i.Reason)
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

// FuzzMoralisSignature checks the re-serialiser against itself and
// against encoding/json: what Stringify accepts, encoding/json accepts
// (when valid UTF-8), to the same values; Stringify's output is a fixed
// point (its own serialisation); and a body and its serialisation sign
// alike, while another secret or a changed signature does not verify.
func FuzzMoralisSignature(f *testing.F) {
	f.Add([]byte(`{"b":1,"2":2,"1":3,"a":{"10":1,"9":2}}`), []byte(secret))
	f.Add([]byte(` { "s" : "\u003c\u2028\ud800\ud83d\ude00\/" , "n":[1.0,1e21,1e-7,-0,5e-324,1e400] } `), []byte("k"))
	f.Add([]byte(`{"a":1,"a":2,"4294967295":0,"4294967294":0}`), []byte{})
	f.Fuzz(func(t *testing.T, body, key []byte) {
		text, err := moralis.Stringify(body)
		// The grammar is JSON's: encoding/json's Valid (with valid UTF-8,
		// which Stringify requires, and nesting within DepthMax) agrees.
		grammar := json.Valid(body) && utf8.Valid(body)
		shallow := bytes.Count(body, []byte("["))+bytes.Count(body, []byte("{")) <= moralis.DepthMax
		if err != nil {
			if grammar && shallow {
				t.Fatalf("Stringify refused JSON: %q", body)
			}
			return
		}
		if !grammar {
			t.Fatalf("Stringify accepted what is not JSON: %q", body)
		}
		again, err := moralis.Stringify(text)
		if err != nil || !bytes.Equal(again, text) {
			t.Fatalf("not a fixed point: %q → %q → %q (%v)", body, text, again, err)
		}
		if !json.Valid(text) {
			t.Fatalf("output is not JSON: %q", text)
		}
		sig, err := moralis.Sign(body, key)
		if err != nil {
			t.Fatal(err)
		}
		// The streamed digest is the digest of the whole serialisation.
		h := sha3.NewLegacyKeccak256()
		h.Write(text)
		h.Write(key)
		if want := "0x" + hex.EncodeToString(h.Sum(nil)); sig != want {
			t.Fatalf("streamed signature %s, of the whole text %s: %q", sig, want, body)
		}
		if !moralis.Verify(body, sig, key) || !moralis.Verify(text, sig, key) {
			t.Fatal("own signature refused")
		}
		if moralis.Verify(body, sig, append(key, 'x')) {
			t.Fatal("another secret verifies")
		}
		flipped := []byte(sig)
		flipped[len(flipped)-1] ^= 1
		if moralis.Verify(body, string(flipped), key) {
			t.Fatal("a changed signature verifies")
		}
	})
}
