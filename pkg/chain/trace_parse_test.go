package chain

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

const (
	traceTx  = "0x00000000000000000000000000000000000000000000000000000000000000aa"
	traceTx2 = "0x00000000000000000000000000000000000000000000000000000000000000bb"
	traceTo  = "0x1111111111111111111111111111111111111111"
)

func TestParseBlockTraces(t *testing.T) {
	call := func(typ, to, value, errText string, calls ...map[string]any) map[string]any {
		f := map[string]any{"type": typ, "from": "0x2222222222222222222222222222222222222222", "to": to, "gas": "0x0", "gasUsed": "0x0", "input": "0x"}
		if value != "" {
			f["value"] = value
		}
		if errText != "" {
			f["error"] = errText
		}
		if len(calls) > 0 {
			f["calls"] = calls
		}
		return f
	}
	block := func(frames ...map[string]any) json.RawMessage {
		var txs []map[string]any
		for i, f := range frames {
			txs = append(txs, map[string]any{"txHash": []string{traceTx, traceTx2}[i], "result": f})
		}
		raw, err := json.Marshal(txs)
		require.NoError(t, err)
		return raw
	}
	precompile := "0x0000000000000000000000000000000000000004"
	deep := call("CALL", traceTo, "0x1", "")
	for range traceDepthMax + 1 {
		deep = call("CALL", traceTo, "0x0", "", deep)
	}
	for _, tc := range []struct {
		name string
		raw  json.RawMessage
		want []string // trace addresses
		err  bool
	}{
		{"the top-level call is the native transfer", block(call("CALL", traceTo, "0x5", "")), nil, false},
		{"a nested call with value", block(call("CALL", "0x9", "0x5", "", call("CALL", traceTo, "0x5", ""))), []string{"CALL_0"}, false},
		{"zero value and no value", block(call("CALL", "0x9", "0x5", "", call("CALL", traceTo, "0x0", ""), call("CALL", traceTo, "", ""))), nil, false},
		{"delegatecall, callcode, staticcall and create move nothing to their to", block(call("CALL", "0x9", "0x5", "",
			call("DELEGATECALL", traceTo, "0x5", ""), call("CALLCODE", traceTo, "0x5", ""), call("STATICCALL", traceTo, "", ""), call("CREATE", traceTo, "0x5", ""))), nil, false},
		{"a failed transaction", block(call("CALL", "0x9", "0x5", "execution reverted", call("CALL", traceTo, "0x5", ""))), nil, false},
		{"a reverted frame and its children", block(call("CALL", "0x9", "0x5", "",
			call("CALL", traceTo, "0x1", "execution reverted", call("CALL", traceTo, "0x1", "")), call("CALL", traceTo, "0x2", ""))), []string{"CALL_1"}, false},
		{"precompile calls take no index", block(call("CALL", "0x9", "0x5", "",
			call("STATICCALL", precompile, "", ""), call("CALL", precompile, "0x0", ""), call("CALL", traceTo, "0x1", "",
				call("CALL", precompile, "0x0", ""), call("CALL", traceTo, "0x1", "")))), []string{"CALL_0", "CALL_0_0"}, false},
		{"two transactions", block(call("CALL", "0x9", "0x5", "", call("CALL", traceTo, "0x1", "")), call("CALL", "0x9", "0x5", "", call("call", traceTo, "0x1", ""))), []string{"CALL_0", "CALL_0"}, false},
		{"an untraced transaction", json.RawMessage(`[{"txHash":"` + traceTx + `","error":"execution timeout"}]`), nil, true},
		{"no tx hash", json.RawMessage(`[{"result":{"type":"CALL"}}]`), nil, true},
		{"a bad value", block(call("CALL", "0x9", "0x5", "", call("CALL", traceTo, "0xzz", ""))), nil, true},
		{"a value past 256 bits", block(call("CALL", "0x9", "0x5", "", call("CALL", traceTo, "0x1"+strings.Repeat("0", 64), ""))), nil, true},
		{"a bad recipient", block(call("CALL", "0x9", "0x5", "", call("CALL", "0x12", "0x1", ""))), nil, true},
		{"no type", json.RawMessage(`[{"txHash":"` + traceTx + `","result":{}}]`), nil, true},
		{"too deep", block(call("CALL", "0x9", "0x5", "", deep)), nil, true},
		{"null", json.RawMessage(`null`), nil, true},
		{"not a list", json.RawMessage(`{}`), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBlockTraces(tc.raw, 9)
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, tr := range got {
				require.Equal(t, traceTo, tr.To)
				require.Equal(t, uint64(9), tr.BlockNumber)
				names = append(names, tr.TraceAddress)
			}
			require.Equal(t, tc.want, names)
		})
	}
}

// FuzzBlockTraces: a node's trace answer never panics the parser, and
// what it returns is always a creditable internal transfer.
func FuzzBlockTraces(f *testing.F) {
	f.Add([]byte(`[{"txHash":"` + traceTx + `","result":{"type":"CALL","to":"0x9","value":"0x5","calls":[{"type":"CALL","to":"` + traceTo + `","value":"0x5"}]}}]`))
	f.Add([]byte(`[{"txHash":"` + traceTx + `","result":{"type":"CALL","calls":[{"type":"CALL","to":"` + traceTo + `","value":"0x5","error":"execution reverted","calls":[{"type":"CALL","to":"` + traceTo + `","value":"0x1"}]}]}}]`))
	f.Add([]byte(`[{"txHash":"` + traceTx + `","error":"timeout"}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := ParseBlockTraces(raw, 1)
		if err != nil {
			return
		}
		for _, tr := range got {
			if tr.Value == nil || tr.Value.Sign() <= 0 || len(tr.To) != addressHexLength || len(tr.TxHash) != hashHexLength ||
				!canonicalHex(tr.To) || !canonicalHex(tr.TxHash) || !strings.HasPrefix(tr.TraceAddress, "CALL_") {
				t.Fatalf("not a creditable internal transfer: %+v", tr)
			}
		}
	})
}

// FuzzTransactionTrace: a node's trace of a transaction never panics the
// parser, and a frame it finds carries a value and, if any, a recipient
// in their one spelling.
func FuzzTransactionTrace(f *testing.F) {
	f.Add([]byte(`{"type":"CALL","to":"0x9","value":"0x5","calls":[{"type":"CALL","to":"`+traceTo+`","value":"0x5"}]}`), "call_0")
	f.Add([]byte(`{"type":"CALL","calls":[{"type":"STATICCALL","to":"0x0000000000000000000000000000000000000004"},{"type":"CALL","to":"`+traceTo+`","value":"0x5","error":"execution reverted","calls":[{"type":"CALL","to":"`+traceTo+`","value":"0x1"}]}]}`), "call_0_0")
	f.Add([]byte(`{"type":"CALL","calls":[{"type":"DELEGATECALL","to":"`+traceTo+`"}]}`), "call_0")
	f.Add([]byte(`null`), "call_0")
	f.Fuzz(func(t *testing.T, raw []byte, address string) {
		_, path, ok := parseTraceAddress(address)
		if !ok {
			return
		}
		if transfers, err := ParseTransactionTransfers(raw); err == nil {
			for _, tr := range transfers {
				if tr.Value.Sign() <= 0 || len(tr.To) != addressHexLength || !canonicalHex(tr.To) || !payment.ValidTraceAddress(tr.TraceAddress) {
					t.Fatalf("not a transfer as the chain shows it: %+v", tr)
				}
			}
		}
		call, found, err := ParseTransactionTrace(raw, path)
		if err != nil || !found {
			return
		}
		if call.Value == nil || call.Value.Sign() < 0 || call.Type == "" || (call.To != "" && len(call.To) != addressHexLength) ||
			call.To != strings.ToLower(call.To) {
			t.Fatalf("not a frame as the chain shows it: %+v", call)
		}
	})
}
