package chain

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
)

// TestInternalTransfers: the dev chain's forwarder moves ETH by contract
// call; the trace scan finds the direct and the nested forward and not
// the one whose frame reverted, and names each frame as the node's own
// Parity-style tracer (flatCallTracer, what Alchemy's trace addresses
// follow) does, a call to a precompile before it taking no index.
func TestInternalTransfers(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	forwarder, _, err := ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	const to = "0x3333333333333333333333333333333333333333"
	direct, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(5), devchain.ForwardDirect)
	require.NoError(t, err)
	reverted, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(11), devchain.ForwardReverted)
	require.NoError(t, err)
	nested, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(7), devchain.ForwardNested)
	require.NoError(t, err)
	for _, tx := range []devchain.Tx{direct, reverted, nested} {
		require.Equal(t, uint64(1), tx.Status, "every forward transaction succeeds")
	}
	var balance string
	require.NoError(t, client.rpc.CallContext(ctx, &balance, "eth_getBalance", to, "latest"))
	require.NoError(t, client.ProbeTraces(ctx, true), "past genesis, which no node traces")
	require.Equal(t, "0xc", balance, "5 direct and 7 nested reached the recipient; the reverted 11 did not")

	all, err := client.InternalTransfers(ctx, []uint64{direct.BlockNumber, reverted.BlockNumber, nested.BlockNumber})
	require.NoError(t, err)
	var got []InternalTransfer
	for _, tr := range all {
		if tr.To == to { // the nested forward's first call, to the forwarder itself, is one too
			got = append(got, tr)
		}
	}
	require.Len(t, all, 3)
	require.Equal(t, []InternalTransfer{
		{TxHash: direct.Hash, BlockNumber: direct.BlockNumber, To: to, Value: big.NewInt(5), TraceAddress: "CALL_0"},
		{TxHash: nested.Hash, BlockNumber: nested.BlockNumber, To: to, Value: big.NewInt(7), TraceAddress: "CALL_0_0"},
	}, got)
	require.Equal(t, "trace:call_0_0", got[1].Index(), "Alchemy's spelling, so both make one event")

	for _, tr := range got {
		var flat []struct {
			TxHash string `json:"txHash"`
			Result []struct {
				TraceAddress []int `json:"traceAddress"`
				Action       struct {
					CallType string `json:"callType"`
					To       string `json:"to"`
				} `json:"action"`
			} `json:"result"`
		}
		require.NoError(t, client.rpc.CallContext(ctx, &flat, MethodTraceBlock, fmt.Sprintf("0x%x", tr.BlockNumber), map[string]any{"tracer": "flatCallTracer"}))
		var names []string
		for _, tx := range flat {
			for _, f := range tx.Result {
				if tx.TxHash == tr.TxHash && strings.EqualFold(f.Action.To, tr.To) && len(f.TraceAddress) > 0 {
					name := strings.ToUpper(f.Action.CallType)
					for _, i := range f.TraceAddress {
						name += fmt.Sprintf("_%d", i)
					}
					names = append(names, name)
				}
			}
		}
		require.Equal(t, []string{tr.TraceAddress}, names, "the node's Parity-style trace names the frame alike")
	}

	_, err = client.InternalTransfers(ctx, make([]uint64, TraceBatchMax+1))
	require.Error(t, err)

	// By hash: the same transfers, each naming the block traced; a hash
	// the node has no block for (another branch's) is an error, never the
	// trace of the block it has at that height.
	at := []BlockID{{Number: direct.BlockNumber, Hash: direct.BlockHash}, {Number: nested.BlockNumber, Hash: nested.BlockHash}}
	byHash, err := client.InternalTransfersAt(ctx, at)
	require.NoError(t, err)
	var gotAt []InternalTransfer
	for _, tr := range byHash {
		if tr.To == to {
			gotAt = append(gotAt, tr)
		}
	}
	require.Equal(t, []InternalTransfer{
		{TxHash: direct.Hash, BlockNumber: direct.BlockNumber, BlockHash: direct.BlockHash, To: to, Value: big.NewInt(5), TraceAddress: "CALL_0"},
		{TxHash: nested.Hash, BlockNumber: nested.BlockNumber, BlockHash: nested.BlockHash, To: to, Value: big.NewInt(7), TraceAddress: "CALL_0_0"},
	}, gotAt)
	_, err = client.InternalTransfersAt(ctx, []BlockID{{Number: direct.BlockNumber, Hash: "0x" + strings.Repeat("ab", 32)}})
	require.ErrorIs(t, err, payment.ErrUnavailable, "no such block")
}

// TestTracesUnsupported: a node without the debug API is told apart from
// an outage, by the probe and by the scan call.
func TestTracesUnsupported(t *testing.T) {
	ctx := testContext(t)
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	require.ErrorIs(t, client.ProbeTraces(ctx, true), ErrTracesUnsupported)
	_, err = client.InternalTransfers(ctx, []uint64{0})
	require.ErrorIs(t, err, ErrTracesUnsupported)
	_, err = client.InternalTransfersAt(ctx, []BlockID{{Number: 1, Hash: "0x" + strings.Repeat("ab", 32)}})
	require.ErrorIs(t, err, ErrTracesUnsupported)
}

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
				!strings.HasPrefix(tr.TraceAddress, "CALL_") {
				t.Fatalf("not a creditable internal transfer: %+v", tr)
			}
		}
	})
}
