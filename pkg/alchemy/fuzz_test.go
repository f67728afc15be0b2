package alchemy_test

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// FuzzDecode feeds arbitrary bodies through the decoder and the activity
// rules. Whatever comes in, nothing panics, every activity is either a
// transfer or ignored, and a transfer is always something the ledger can
// store: a positive, in-range amount of a registered asset, a lowercase
// recipient and hash, and an id that fits.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"testdata/acceptance.json"} {
		body, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	f.Add([]byte(`{"type":"ADDRESS_ACTIVITY","event":{"network":"ETH_MAINNET","activity":[{"category":"internal","hash":"0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","toAddress":"0x7a250d5630b4cf539739df2c5dacb4c659f2488d","typeTraceAddress":"CALL_0","rawContract":{"rawValue":"0xafdbfcdc61c000"}}]}}`))
	f.Add([]byte(`{"type":"ADDRESS_ACTIVITY","event":{"network":"ETH_MAINNET","activity":[{"category":"token","hash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72","toAddress":"0xbe3f4b43db5eb49d1f48f53443b9abce45da3b79","rawContract":{"rawValue":"0x1","address":"0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"},"log":{"logIndex":"0x1","removed":true}}]}}`))
	f.Add([]byte(`{"type":"ADDRESS_ACTIVITY","event":{"error":"capacity"}}`))
	f.Add([]byte(`null`))
	reg := registry()
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := alchemy.Decode(body)
		if err != nil {
			return
		}
		transfers, ignored := alchemy.Transfers(p, reg)
		if len(transfers)+len(ignored) != len(p.Activities) {
			t.Fatalf("%d activities, %d transfers, %d ignored", len(p.Activities), len(transfers), len(ignored))
		}
		for _, i := range ignored {
			if !slices.Contains(alchemy.Reasons, i.Reason) {
				t.Fatalf("reason %q is not in alchemy.Reasons, the metric's labels", i.Reason)
			}
		}
		for _, tr := range transfers {
			if len(tr.EventID()) > alchemy.EventIDLengthMax {
				t.Fatalf("event id %q is too long", tr.EventID())
			}
			if index, err := payment.ParseTransferIndex(tr.Index); err != nil || index != tr.Index {
				t.Fatalf("transfer index %q does not round-trip: %q, %v", tr.Index, index, err)
			}
			if err := money.CheckRange(tr.Amount); err != nil {
				t.Fatalf("amount %s: %v", tr.Amount, err)
			}
			if _, ok := money.ToBaseUnits(tr.Amount, tr.Asset.Decimals); !ok {
				t.Fatalf("amount %s finer than %d decimals", tr.Amount, tr.Asset.Decimals)
			}
			registered, ok := reg.Listing(tr.Asset.Network, tr.Asset.Code)
			if !ok || registered != tr.Asset {
				t.Fatalf("asset %+v is not the registry's", tr.Asset)
			}
			if tr.ToAddress != strings.ToLower(tr.ToAddress) || len(tr.ToAddress) != 42 {
				t.Fatalf("recipient %q", tr.ToAddress)
			}
			if tr.TxHash != strings.ToLower(tr.TxHash) || len(tr.TxHash) != 66 {
				t.Fatalf("tx hash %q", tr.TxHash)
			}
		}
	})
}

// FuzzVerify: a signature made with the key verifies in either letter
// case; any change to the body or to the signature makes it fail.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"webhookId":"wh_1"}`), []byte("whsec_test"), uint8(0))
	f.Add([]byte{}, []byte{}, uint8(63))
	f.Add([]byte("x"), []byte("whsec_"+strings.Repeat("k", 100)), uint8(17))
	f.Fuzz(func(t *testing.T, body, key []byte, position uint8) {
		sig := alchemy.Sign(body, key)
		if !alchemy.Verify(body, sig, key) || !alchemy.Verify(body, strings.ToUpper(sig), key) {
			t.Fatal("own signature refused")
		}
		i := int(position) % len(sig)
		mutated := []byte(sig)
		if mutated[i] == '0' {
			mutated[i] = '1'
		} else {
			mutated[i] = '0'
		}
		if alchemy.Verify(body, string(mutated), key) {
			t.Fatal("mutated signature accepted")
		}
		changed := append(bytes.Clone(body), 0)
		if alchemy.Verify(changed, sig, key) {
			t.Fatal("changed body accepted")
		}
	})
}
