package alchemy_test

import (
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/payment"
)

// registry mirrors the assets migration 0001 seeds.
func registry() *payment.Registry {
	return payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: "ETH_MAINNET", Decimals: 18},
		{Code: "USDC", Network: "ETH_MAINNET", Contract: "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", Decimals: 6},
		{Code: "USDT", Network: "ETH_MAINNET", Contract: "0xdac17f958d2ee523a2206206994597c13d831ec7", Decimals: 6},
		{Code: "WBTC", Network: "ETH_MAINNET", Contract: "0x2260fac5e5542a773aa44fbcfedf7c193bc2c599", Decimals: 8},
	})
}

const (
	tx1       = "0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72"
	recipient = "0xbe3f4b43db5eb49d1f48f53443b9abce45da3b79"
	usdc      = "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"
)

func decodeFile(t *testing.T, name string) alchemy.Payload {
	t.Helper()
	body, err := os.ReadFile(name)
	require.NoError(t, err)
	p, err := alchemy.Decode(body)
	require.NoError(t, err)
	return p
}

func TestTransfersOfTheAcceptancePayload(t *testing.T) {
	p := decodeFile(t, "testdata/acceptance.json")
	require.Equal(t, "ETH_MAINNET", p.Network)
	require.Len(t, p.Activities, 5)

	transfers, ignored := alchemy.Transfers(p, registry())
	require.Equal(t, []payment.Ignored{
		{Index: 2, Reason: payment.IgnoreNFT},
		{Index: 3, Reason: payment.IgnoreUnknownAsset}, // "USDC" by symbol, at a foreign contract
	}, ignored)
	require.Len(t, transfers, 3)

	eth := transfers[0]
	require.Equal(t, "chain:ETH_MAINNET:"+tx1+":native", eth.EventID())
	require.Equal(t, "native", eth.Index)
	require.Equal(t, tx1, eth.TxHash, "stored lowercase")
	require.Equal(t, recipient, eth.ToAddress, "stored lowercase")
	require.Equal(t, "ETH", eth.Asset.Code)
	// The float "value" says 1.0; the raw value says one wei more.
	require.Equal(t, "1.000000000000000001", eth.Amount.String())
	require.False(t, eth.Removed)

	token := transfers[1]
	require.Equal(t, "chain:ETH_MAINNET:"+tx1+":110", token.EventID(), "log index 0x6e")
	require.Equal(t, "110", token.Index)
	require.Equal(t, "USDC", token.Asset.Code)
	require.Equal(t, "293.092129", token.Amount.String())
	require.NotEqual(t, eth.EventID(), token.EventID(), "an ETH and a token transfer in one transaction are two deposits")

	// The address lookup is the caller's job: this one is simply a transfer.
	require.Equal(t, "0x7a250d5630b4cf539739df2c5dacb4c659f2488d", transfers[2].ToAddress)
	require.Equal(t, "0.0495", transfers[2].Amount.String())

	again, _ := alchemy.Transfers(decodeFile(t, "testdata/acceptance.json"), registry())
	require.Equal(t, transfers, again, "a redelivery maps to the same ids and amounts")
}

// activityJSON builds one activity from a base token transfer, with
// fields replaced (nil deletes a field).
func activityJSON(t *testing.T, changes map[string]any) json.RawMessage {
	t.Helper()
	a := map[string]any{
		"blockNum":         "0xdf34a3",
		"hash":             tx1,
		"fromAddress":      "0x503828976d22510aad0201ac7ec88293211d23da",
		"toAddress":        recipient,
		"value":            293.092129,
		"erc721TokenId":    nil,
		"erc1155Metadata":  nil,
		"asset":            "USDC",
		"category":         "token",
		"rawContract":      map[string]any{"rawValue": "0x11783b21", "address": usdc, "decimals": 6},
		"typeTraceAddress": nil,
		"log":              map[string]any{"address": usdc, "transactionHash": tx1, "logIndex": "0x6e", "removed": false},
	}
	for k, v := range changes {
		if v == nil {
			delete(a, k)
		} else {
			a[k] = v
		}
	}
	raw, err := json.Marshal(a)
	require.NoError(t, err)
	return raw
}

func judge(t *testing.T, activity json.RawMessage) (payment.ReportedTransfer, payment.IgnoreReason) {
	t.Helper()
	p := alchemy.Payload{Type: alchemy.TypeAddressActivity, Network: "ETH_MAINNET", Activities: []json.RawMessage{activity}}
	transfers, ignored := alchemy.Transfers(p, registry())
	require.Equal(t, 1, len(transfers)+len(ignored))
	if len(ignored) == 1 {
		return payment.ReportedTransfer{}, ignored[0].Reason
	}
	return transfers[0], ""
}

func TestActivityRules(t *testing.T) {
	cases := []struct {
		name    string
		changes map[string]any
		reason  payment.IgnoreReason
	}{
		{"token transfer", map[string]any{}, ""},
		{"erc20 category is a token", map[string]any{"category": "erc20"}, ""},
		{"erc721 token id", map[string]any{"erc721TokenId": "0x1"}, payment.IgnoreNFT},
		{"erc1155 metadata", map[string]any{"erc1155Metadata": []any{map[string]any{"tokenId": "0x1", "value": "0x1"}}}, payment.IgnoreNFT},
		{"erc1155 category", map[string]any{"category": "erc1155"}, payment.IgnoreNFT},
		{"empty raw value", map[string]any{"rawContract": map[string]any{"rawValue": "0x", "address": usdc}}, payment.IgnoreNFT},
		{"zero raw value", map[string]any{"rawContract": map[string]any{"rawValue": "0x0", "address": usdc}}, payment.IgnoreZeroAmount},
		{"raw value at 10^20", map[string]any{"rawContract": map[string]any{"rawValue": fmt.Sprintf("0x%x", mustBig("100000000000000000000000000")), "address": usdc}}, payment.IgnoreAmountOutOfRange},
		{"raw value not hex", map[string]any{"rawContract": map[string]any{"rawValue": "0xzz", "address": usdc}}, payment.IgnoreMalformed},
		{"raw value missing", map[string]any{"rawContract": map[string]any{"address": usdc}}, payment.IgnoreMalformed},
		{"no raw contract", map[string]any{"rawContract": nil}, payment.IgnoreMalformed},
		{"foreign contract", map[string]any{"rawContract": map[string]any{"rawValue": "0x1", "address": "0x1111111111111111111111111111111111111111"}, "log": map[string]any{"logIndex": "0x1"}}, payment.IgnoreUnknownAsset},
		{"log from another contract", map[string]any{"log": map[string]any{"address": "0x1111111111111111111111111111111111111111", "logIndex": "0x1"}}, alchemy.IgnoreContractMismatch},
		{"token without log", map[string]any{"log": nil}, payment.IgnoreMalformed},
		{"token without log index", map[string]any{"log": map[string]any{"address": usdc}}, payment.IgnoreMalformed},
		{"bad log index", map[string]any{"log": map[string]any{"logIndex": "110"}}, payment.IgnoreMalformed},
		{"log of another transaction", map[string]any{"log": map[string]any{"logIndex": "0x1", "transactionHash": "0x" + strings.Repeat("1", 64)}}, payment.IgnoreMalformed},
		{"bad recipient", map[string]any{"toAddress": "0x1234"}, payment.IgnoreMalformed},
		{"no recipient", map[string]any{"toAddress": nil}, payment.IgnoreMalformed},
		{"bad hash", map[string]any{"hash": "0x12"}, payment.IgnoreMalformed},
		{"hash only in the log", map[string]any{"hash": nil}, ""},
		{"field of the wrong type", map[string]any{"toAddress": 7}, payment.IgnoreMalformed},
		{"unknown category", map[string]any{"category": "staking"}, alchemy.IgnoreUnsupportedCategory},
		{"external with a contract", map[string]any{"category": "external", "log": nil}, alchemy.IgnoreContractMismatch},
		{"external", map[string]any{"category": "external", "log": nil, "rawContract": map[string]any{"rawValue": "0x1", "decimals": 18}}, ""},
		{"internal without trace address", map[string]any{"category": "internal", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}, payment.IgnoreMalformed},
		{"internal with a bad trace address", map[string]any{"category": "internal", "typeTraceAddress": "CALL 0", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}, payment.IgnoreMalformed},
		{"internal", map[string]any{"category": "internal", "typeTraceAddress": "CALL_0_1", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}, ""},
		{"unknown fields", map[string]any{"brandNew": map[string]any{"x": []any{1, "y"}}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, reason := judge(t, activityJSON(t, tc.changes))
			require.Equal(t, tc.reason, reason)
		})
	}
}

func mustBig(decimal string) fmt.Formatter {
	n, ok := new(big.Int).SetString(decimal, 10)
	if !ok {
		panic(decimal)
	}
	return n
}

func TestEventIDs(t *testing.T) {
	internal, reason := judge(t, activityJSON(t, map[string]any{"category": "internal", "typeTraceAddress": "CALL_0_1", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}))
	require.Empty(t, reason)
	require.Equal(t, "chain:ETH_MAINNET:"+tx1+":trace:call_0_1", internal.EventID(), "trace addresses are lowercase")
	require.Equal(t, "0.000000000000000001", internal.Amount.String())

	other, _ := judge(t, activityJSON(t, map[string]any{"category": "internal", "typeTraceAddress": "CALL_0_2", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}))
	require.NotEqual(t, internal.EventID(), other.EventID())
	require.True(t, payment.InternalTransfer(internal.Index), "the chain check cannot see its recipient and value")
	external, _ := judge(t, activityJSON(t, map[string]any{"category": "external", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}))
	require.Equal(t, "chain:ETH_MAINNET:"+tx1+":native", external.EventID())
	require.False(t, payment.InternalTransfer(external.Index))
	// The id is the transfer identity's, whoever reports the transfer.
	require.Equal(t, payment.Transfer{Network: "ETH_MAINNET", TxHash: tx1, Index: "native"}.EventID(), external.EventID())

	// The same log written with other hex spellings is the same transfer.
	a, _ := judge(t, activityJSON(t, map[string]any{"log": map[string]any{"logIndex": "0x6e"}}))
	_, refused := judge(t, activityJSON(t, map[string]any{"log": map[string]any{"logIndex": "0x006E"}, "hash": strings.ToUpper(tx1[2:])}))
	require.Equal(t, payment.IgnoreMalformed, refused, "a hash without 0x is refused")
	b, _ := judge(t, activityJSON(t, map[string]any{"log": map[string]any{"logIndex": "0x006E"}, "hash": "0x" + strings.ToUpper(tx1[2:])}))
	require.Equal(t, a.EventID(), b.EventID())

	// The longest possible id still leaves room for "reorg:".
	network := "E" + strings.Repeat("X", 63)
	reg := payment.NewRegistry([]payment.Asset{{Code: "ETH", Network: network, Decimals: 18}})
	long := activityJSON(t, map[string]any{"category": "internal", "typeTraceAddress": strings.Repeat("C", 96), "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}})
	transfers, ignored := alchemy.Transfers(alchemy.Payload{Type: alchemy.TypeAddressActivity, Network: network, Activities: []json.RawMessage{long}}, reg)
	require.Empty(t, ignored)
	require.LessOrEqual(t, len(transfers[0].EventID()), alchemy.EventIDLengthMax)
	require.LessOrEqual(t, len(payment.CompensationEventID(transfers[0].EventID())), 256)
}

func TestRemovedLog(t *testing.T) {
	removed, reason := judge(t, activityJSON(t, map[string]any{"log": map[string]any{"address": usdc, "logIndex": "0x6e", "removed": true}}))
	require.Empty(t, reason)
	require.True(t, removed.Removed)
	credited, _ := judge(t, activityJSON(t, map[string]any{}))
	require.Equal(t, credited.EventID(), removed.EventID(), "a removal names the deposit it reverses")
}

// TestLogBlockHash: a token log's blockHash is read, lowercase; one that
// is no hash is not read, and the transfer still counts; a native
// transfer (no log) names no block.
func TestLogBlockHash(t *testing.T) {
	hash := "0x" + strings.Repeat("Ab", 32)
	for name, c := range map[string]struct {
		log  any
		want string
	}{
		"a hash":          {map[string]any{"address": usdc, "logIndex": "0x6e", "blockHash": hash}, strings.ToLower(hash)},
		"a removed block": {map[string]any{"address": usdc, "logIndex": "0x6e", "blockHash": hash, "removed": true}, strings.ToLower(hash)},
		"too short":       {map[string]any{"address": usdc, "logIndex": "0x6e", "blockHash": hash[:65]}, ""},
		"not hex":         {map[string]any{"address": usdc, "logIndex": "0x6e", "blockHash": "0x" + strings.Repeat("zz", 32)}, ""},
		"none":            {map[string]any{"address": usdc, "logIndex": "0x6e"}, ""},
	} {
		tr, reason := judge(t, activityJSON(t, map[string]any{"log": c.log}))
		require.Empty(t, reason, name)
		require.Equal(t, c.want, tr.BlockHash, name)
	}
	eth, reason := judge(t, activityJSON(t, map[string]any{"category": "external", "log": nil, "rawContract": map[string]any{"rawValue": "0x1"}}))
	require.Empty(t, reason)
	require.Empty(t, eth.BlockHash)
}

func TestDecodeEnvelope(t *testing.T) {
	for name, body := range map[string]string{
		"not json":                  `{"event":`,
		"array":                     `[]`,
		"no event":                  `{"type":"ADDRESS_ACTIVITY"}`,
		"event not an object":       `{"type":"ADDRESS_ACTIVITY","event":"x"}`,
		"activity not an array":     `{"type":"ADDRESS_ACTIVITY","event":{"network":"ETH_MAINNET","activity":{}}}`,
		"network not a name":        `{"type":"ADDRESS_ACTIVITY","event":{"network":"eth-mainnet","activity":[{}]}}`,
		"network of the wrong type": `{"type":"ADDRESS_ACTIVITY","event":{"network":1,"activity":[]}}`,
	} {
		_, err := alchemy.Decode([]byte(body))
		require.ErrorIs(t, err, alchemy.ErrPayload, name)
	}

	tooMany := `{"type":"ADDRESS_ACTIVITY","event":{"network":"ETH_MAINNET","activity":[` +
		strings.Repeat(`{},`, alchemy.ActivitiesMax) + `{}]}}`
	_, err := alchemy.Decode([]byte(tooMany))
	require.ErrorIs(t, err, alchemy.ErrPayload)

	// Alchemy reports its own errors in an event without activities.
	p, err := alchemy.Decode([]byte(`{"type":"ADDRESS_ACTIVITY","event":{"error":"Monthly capacity limit exceeded."}}`))
	require.NoError(t, err)
	require.Empty(t, p.Activities)

	// Another webhook type pointed here is acknowledged, never credited.
	p, err = alchemy.Decode([]byte(`{"type":"NFT_ACTIVITY","event":{"network":"ETH_MAINNET","activity":[{},{}]}}`))
	require.NoError(t, err)
	transfers, ignored := alchemy.Transfers(p, registry())
	require.Empty(t, transfers)
	require.Equal(t, []payment.Ignored{{Index: 0, Reason: alchemy.IgnoreNotAddressActivity}, {Index: 1, Reason: alchemy.IgnoreNotAddressActivity}}, ignored)
}

func TestSignature(t *testing.T) {
	body := []byte(`{"webhookId":"wh_1"}`)
	key := []byte("whsec_test")
	sig := alchemy.Sign(body, key)
	require.Len(t, sig, alchemy.SignatureHexLength)
	require.Equal(t, strings.ToLower(sig), sig)

	require.True(t, alchemy.Verify(body, sig, key))
	require.True(t, alchemy.Verify(body, strings.ToUpper(sig), key), "hex compared case-insensitively")
	require.True(t, alchemy.Verify(body, sig, []byte("whsec_other"), key), "any one of several keys")
	require.False(t, alchemy.Verify(body, sig, []byte("whsec_other")))
	require.False(t, alchemy.Verify(body, sig))
	require.False(t, alchemy.Verify(append(body, ' '), sig, key), "the raw bytes are signed")
	require.False(t, alchemy.Verify(body, "", key))
	require.False(t, alchemy.Verify(body, sig[:62], key))
	require.False(t, alchemy.Verify(body, sig+"00", key))
	require.False(t, alchemy.Verify(body, "sha256="+sig[7:], key))
	require.False(t, alchemy.Verify(body, strings.Repeat("zz", 32), key))
	// The whsec_ prefix is part of the key.
	require.False(t, alchemy.Verify(body, sig, []byte("test")))
}

// TestInternalTransferHasOneIDForAlchemyAndTheScanner: Alchemy spells a
// call type in lowercase ("call_1_1_0", as in its own example), the
// scanner's trace walk in upper case; both must derive one event id and
// one claim, or one internal transfer is credited twice.
func TestInternalTransferHasOneIDForAlchemyAndTheScanner(t *testing.T) {
	const to = "0xe592427a0aece92de3edee1f18e0157c05861564"
	const tx = "0x1635135c035cd81320e444f4dd88296f408ee7305c3e07f7863e3142d017ec45"

	// Alchemy's report, as in its documentation's example.
	body, err := json.Marshal(map[string]any{
		"webhookId": "wh_1", "id": "whevt_1", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{map[string]any{
			"blockNum": "0xbe09fa", "hash": tx, "fromAddress": "0xc02aaa39b223fe8d0a0e5c4f27ead9083c756cc2",
			"toAddress": to, "value": 0.33974794305157613, "asset": "ETH", "category": "internal",
			"erc721TokenId": nil, "typeTraceAddress": "call_1_1_0",
			"rawContract": map[string]any{"rawValue": "0x4b706f442c2433c", "address": nil, "decimals": 18},
			"log":         nil,
		}}},
	})
	require.NoError(t, err)
	p, err := alchemy.Decode(body)
	require.NoError(t, err)
	transfers, ignored := alchemy.Transfers(p, registry())
	require.Empty(t, ignored)
	require.Len(t, transfers, 1)

	// The scanner's view of the same frame: the call at trace address
	// [1, 1, 0] of the transaction, from debug_traceBlockByNumber.
	frame := func(typ, to, value string, calls ...map[string]any) map[string]any {
		f := map[string]any{"type": typ, "from": "0xc02aaa39b223fe8d0a0e5c4f27ead9083c756cc2", "to": to, "value": value, "gas": "0x0", "gasUsed": "0x0", "input": "0x"}
		if len(calls) > 0 {
			f["calls"] = calls
		}
		return f
	}
	other := "0x9999999999999999999999999999999999999999"
	trace, err := json.Marshal([]any{map[string]any{"txHash": tx, "result": frame("CALL", other, "0x0",
		frame("CALL", other, "0x0"),
		frame("CALL", other, "0x0",
			frame("CALL", other, "0x0"),
			frame("CALL", other, "0x0",
				frame("CALL", to, "0x4b706f442c2433c"))))}})
	require.NoError(t, err)
	found, err := chain.ParseBlockTraces(trace, 0xbe09fa)
	require.NoError(t, err)
	require.Len(t, found, 1)
	scanned := transfers[0].Transfer
	scanned.Index = found[0].Index()

	require.Equal(t, scanned.EventID(), transfers[0].EventID(), "one internal transfer, one event id whoever reports it")
}
