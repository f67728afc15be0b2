package quicknode_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/quicknode"
)

const token = "qn-security-token-0123456789abcdef"

// TestSignatureKnownAnswers pins Sign and Verify to digests computed
// outside Go, once, with Python's hmac module:
//
//	hmac.new(TOKEN, NONCE + TIMESTAMP + BODY, hashlib.sha256).hexdigest()
func TestSignatureKnownAnswers(t *testing.T) {
	const body = `{"data":[],"metadata":{"network":"ethereum-mainnet","dataset":"logs"}}`
	for _, v := range []struct{ name, body, want string }{
		{"logs delivery", body, "7ff6b04e8240be89a00641f206b81b9a95eed38753c2f96d6996c9783faefdad"},
		{"empty body", "", "53d88e835a3de2b556ea48a94d924b7d5ee3187627f4bc6892bf6011fd69f748"},
	} {
		require.Equal(t, v.want, quicknode.Sign("nonce-abc123", "1700000000", []byte(v.body), []byte(token)), v.name)
		require.True(t, quicknode.Verify("nonce-abc123", "1700000000", []byte(v.body), v.want, []byte(token)), v.name)
		require.True(t, quicknode.Verify("nonce-abc123", "1700000000", []byte(v.body), strings.ToUpper(v.want), []byte("other"), []byte(token)), v.name)
	}
	good := "7ff6b04e8240be89a00641f206b81b9a95eed38753c2f96d6996c9783faefdad"
	require.False(t, quicknode.Verify("nonce-abc124", "1700000000", []byte(body), good, []byte(token)), "other nonce")
	require.False(t, quicknode.Verify("nonce-abc123", "1700000001", []byte(body), good, []byte(token)), "other timestamp")
	require.False(t, quicknode.Verify("nonce-abc123", "1700000000", []byte(body+" "), good, []byte(token)), "other body")
	require.False(t, quicknode.Verify("nonce-abc123", "1700000000", []byte(body), good, []byte(token+"x")), "other token")
	// QuickNode concatenates without separators, so a digit moved from
	// the nonce to the timestamp is the same message: the signature holds,
	// and only the replay window refuses it (the timestamp it leaves is
	// years old).
	require.True(t, quicknode.Verify("nonce-abc1231", "700000000", []byte(body), good, []byte(token)), "digit moved")
	require.False(t, quicknode.Fresh("700000000", time.Unix(1_700_000_000, 0), quicknode.MaxAgeDefault))
	// A '0' moved the same way would leave the time as it was: a leading
	// zero is refused, so the signature fails.
	zero := quicknode.Sign("nonce-abc120", "1700000000", []byte(body), []byte(token))
	require.True(t, quicknode.Verify("nonce-abc120", "1700000000", []byte(body), zero, []byte(token)))
	require.False(t, quicknode.Verify("nonce-abc12", "01700000000", []byte(body), zero, []byte(token)), "zero moved")
	require.False(t, quicknode.Fresh("01700000000", time.Unix(1_700_000_000, 0), quicknode.MaxAgeDefault))
	require.True(t, quicknode.Fresh("0", time.Unix(0, 0), quicknode.MaxAgeDefault), "zero itself is a timestamp")
	require.False(t, quicknode.Verify("nonce-abc123", "+1700000000", []byte(body), quicknode.Sign("nonce-abc123", "+1700000000", []byte(body), []byte(token)), []byte(token)), "signed but not a timestamp")
	require.False(t, quicknode.Verify("", "1700000000", []byte(body), quicknode.Sign("", "1700000000", []byte(body), []byte(token)), []byte(token)), "no nonce")
}

func TestFresh(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ts := func(d time.Duration) string { return fmt.Sprint(now.Add(d).Unix()) }
	require.True(t, quicknode.Fresh(ts(0), now, 5*time.Minute))
	require.True(t, quicknode.Fresh(ts(-5*time.Minute), now, 5*time.Minute))
	require.False(t, quicknode.Fresh(ts(-5*time.Minute-time.Second), now, 5*time.Minute), "stale")
	require.True(t, quicknode.Fresh(ts(quicknode.FutureSkewMax), now, 5*time.Minute))
	require.False(t, quicknode.Fresh(ts(quicknode.FutureSkewMax+time.Second), now, 5*time.Minute), "far future")
	require.False(t, quicknode.Fresh("", now, 5*time.Minute))
	require.False(t, quicknode.Fresh("17e8", now, 5*time.Minute))
	require.False(t, quicknode.Fresh("1700000000000", now, 5*time.Minute), "milliseconds are not seconds")
}

const (
	usdc     = "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"
	to       = "0x1111111111111111111111111111111111111111"
	toTopic  = "0x0000000000000000000000001111111111111111111111111111111111111111"
	from     = "0x0000000000000000000000009999999999999999999999999999999999999999"
	txToken  = "0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72"
	txNative = "0x0a20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e"
	txFailed = "0x0b20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e"
)

func registry() *payment.Registry {
	return payment.NewRegistry([]payment.Asset{
		{Code: "ETH", Network: "ETH_MAINNET", Decimals: 18},
		{Code: "USDC", Network: "ETH_MAINNET", Contract: usdc, Decimals: 6},
	})
}

func transferLog(tx, index, block, value string) string {
	return fmt.Sprintf(`{"address":%q,"topics":[%q,%q,%q],"data":"0x%064s","blockNumber":%q,"transactionHash":%q,"logIndex":%q,"removed":false}`,
		strings.ToUpper(usdc[:2])+usdc[2:], quicknode.TransferTopic, from, toTopic, value, block, tx, index)
}

func TestBlockWithReceipts(t *testing.T) {
	body := fmt.Sprintf(`{"data":[{"block":{"number":"0x10","hash":"0xab","transactions":[
	  {"hash":%q,"to":%q,"value":"0x1bc16d674ec80000","input":"0x"},
	  {"hash":%q,"to":%q,"value":"0x5"},
	  {"hash":%q,"to":%q,"value":"0x0"},
	  {"hash":"0x0c20777dadad23b885daf4cd95a955293f230de3abd64705db324f45ae0f664e","to":%q,"value":"0x1"}]},
	 "receipts":[
	  {"transactionHash":%q,"status":"0x1","logs":[]},
	  {"transactionHash":%q,"status":"0x0","logs":[]},
	  {"transactionHash":%q,"status":"0x1","logs":[%s,
	    {"address":%q,"topics":["0x8c5be1e5ebec7d5bd14f71427d1e84f3dd0314c0f7b2291e5b200ac8c7c3b925",%q,%q],"data":"0x01","logIndex":"0x1","transactionHash":%q,"blockNumber":"0x10"},
	    {"address":%q,"topics":[%q,%q,%q,"0x01"],"data":"0x","logIndex":"0x2","transactionHash":%q,"blockNumber":"0x10"}]}]}],
	 "metadata":{"network":"ethereum-mainnet","dataset":"block_with_receipts","blocks_reorged":null,"batch_start_range":16,"extra":{"x":1}}}`,
		txNative, to, txFailed, to, txToken, to, to,
		txNative, txFailed, txToken, transferLog(txToken, "0x0", "0x10", "6acfc0"),
		usdc, from, toTopic, txToken,
		usdc, quicknode.TransferTopic, from, toTopic, txToken)
	p, err := quicknode.Decode([]byte(body))
	require.NoError(t, err)
	require.Equal(t, "ETH_MAINNET", p.Network)
	transfers, ignored := quicknode.Transfers(p, registry())
	require.Len(t, transfers, 2, "%+v", ignored)
	require.Equal(t, "chain:ETH_MAINNET:"+txToken+":0", transfers[0].EventID())
	require.Equal(t, "7", transfers[0].Amount.String())
	require.Equal(t, to, transfers[0].ToAddress)
	require.Equal(t, "chain:ETH_MAINNET:"+txNative+":native", transfers[1].EventID())
	require.Equal(t, "2", transfers[1].Amount.String())
	require.False(t, transfers[0].Removed || transfers[1].Removed)
	reasons := map[payment.IgnoreReason]int{}
	for _, i := range ignored {
		reasons[i.Reason]++
	}
	require.Equal(t, map[payment.IgnoreReason]int{payment.IgnoreFailed: 1, payment.IgnoreNoReceipt: 1, payment.IgnoreNFT: 1}, reasons)
	require.Equal(t, p.Candidates(), len(transfers)+len(ignored))
}

func TestReceiptsAndLogsDatasets(t *testing.T) {
	receipts := fmt.Sprintf(`{"data":[[{"transactionHash":%q,"status":"0x1","logs":[%s]}],[]],"metadata":{"network":"ethereum-mainnet","dataset":"receipts","blocks_reorged":[17]}}`,
		txToken, transferLog(txToken, "0x3", "0x11", "f4240"))
	p, err := quicknode.Decode([]byte(receipts))
	require.NoError(t, err)
	transfers, ignored := quicknode.Transfers(p, registry())
	require.Empty(t, ignored)
	require.Len(t, transfers, 1)
	require.Equal(t, "chain:ETH_MAINNET:"+txToken+":3", transfers[0].EventID())
	require.Equal(t, "1", transfers[0].Amount.String())
	require.True(t, transfers[0].Removed, "block 17 (0x11) is in blocks_reorged")
	require.True(t, transfers[0].Reorged, "sent again on the new branch")

	logs := fmt.Sprintf(`{"data":[[%s,%s]],"metadata":{"network":"base-mainnet","dataset":"logs"}}`,
		transferLog(txToken, "0x3", "0x11", "f4240"), transferLog(txToken, "0x4", "0x11", "0"))
	p, err = quicknode.Decode([]byte(logs))
	require.NoError(t, err)
	require.Equal(t, "BASE_MAINNET", p.Network)
	transfers, ignored = quicknode.Transfers(p, registry())
	require.Empty(t, transfers, "USDC is listed on ETH_MAINNET only")
	require.Len(t, ignored, 2)

	p, err = quicknode.Decode([]byte(strings.Replace(logs, "base-mainnet", "bnbchain-mainnet", 1)))
	require.NoError(t, err)
	_, ignored = quicknode.Transfers(p, registry())
	require.Equal(t, []payment.Ignored{{Index: 0, Reason: payment.IgnoreUnknownNetwork}, {Index: 1, Reason: payment.IgnoreUnknownNetwork}}, ignored)

	for _, bad := range []string{`{"data":[]}`, `{"data":{},"metadata":{"dataset":"logs"}}`, `{"metadata":{"blocks_reorged":["x"]}}`, `[`} {
		_, err := quicknode.Decode([]byte(bad))
		require.ErrorIs(t, err, quicknode.ErrPayload, bad)
	}
}

func TestNetworkNames(t *testing.T) {
	for qn, settle := range map[string]string{
		"ethereum-mainnet": "ETH_MAINNET", "base-mainnet": "BASE_MAINNET", "arbitrum-mainnet": "ARB_MAINNET",
		"optimism-mainnet": "OPT_MAINNET", "polygon-mainnet": "MATIC_MAINNET", "matic-mainnet": "MATIC_MAINNET",
		"ethereum-sepolia": "ETH_SEPOLIA", "base-sepolia": "BASE_SEPOLIA",
	} {
		got, ok := quicknode.Network(qn)
		require.True(t, ok, qn)
		require.Equal(t, settle, got)
	}
	// Any other name is its own, upper-cased with '-' as '_': a network
	// added at run time under it is fed without a release.
	for qn, settle := range map[string]string{"bsc-mainnet": "BSC_MAINNET", "avalanche-fuji": "AVALANCHE_FUJI", "Zora-Mainnet": "ZORA_MAINNET"} {
		got, ok := quicknode.Network(qn)
		require.True(t, ok, qn)
		require.Equal(t, settle, got)
	}
	for _, qn := range []string{"", "9-mainnet", "base mainnet", "base.mainnet", "ünicode-mainnet", "-mainnet"} {
		_, ok := quicknode.Network(qn)
		require.False(t, ok, "%q is no network name", qn)
	}
}

// A stream on a network the table does not name is credited once settle
// lists the network under the derived name, and ignored as an unknown
// network until then.
func TestDerivedNetworkNeedsListing(t *testing.T) {
	body := fmt.Sprintf(`{"data":[{"block":{"number":"0x10","hash":"0xab","transactions":[{"hash":%q,"to":%q,"value":"0x1bc16d674ec80000"}]},
	 "receipts":[{"transactionHash":%q,"status":"0x1","logs":[]}]}],
	 "metadata":{"network":"bsc-mainnet","dataset":"block_with_receipts"}}`, txNative, to, txNative)
	p, err := quicknode.Decode([]byte(body))
	require.NoError(t, err)
	require.Equal(t, "BSC_MAINNET", p.Network)
	transfers, ignored := quicknode.Transfers(p, registry())
	require.Empty(t, transfers)
	require.Equal(t, []payment.Ignored{{Index: 0, Reason: payment.IgnoreUnknownNetwork}}, ignored)

	listed := payment.NewRegistry([]payment.Asset{{Code: "BNB", Network: "BSC_MAINNET", Decimals: 18}},
		payment.Network{Name: "BSC_MAINNET", ChainID: 56})
	transfers, ignored = quicknode.Transfers(p, listed)
	require.Empty(t, ignored)
	require.Len(t, transfers, 1)
	require.Equal(t, "chain:BSC_MAINNET:"+txNative+":native", transfers[0].EventID())
	require.Equal(t, "2", transfers[0].Amount.String())
}

// timeOf is the instant a well-formed timestamp names (else the epoch),
// so Fresh with no age says only whether it is well formed.
func timeOf(timestamp string) time.Time {
	n, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil || strings.TrimLeft(timestamp, "0123456789") != "" {
		return time.Unix(0, 0)
	}
	return time.Unix(n, 0)
}

// Each transfer names the block it was delivered in (the log's
// blockHash, the block's hash), so the intake weighs it with the other
// providers' reports of that block; one sent again for blocks_reorged
// names none: its block is the reorg's new branch, not a removed one.
func TestTransfersNameTheirBlock(t *testing.T) {
	blockHash := "0x" + strings.Repeat("AB", 32)
	body := func(reorged string) []byte {
		return []byte(fmt.Sprintf(`{"data":[{"block":{"number":"0x10","hash":%q,"transactions":[{"hash":%q,"to":%q,"value":"0x5"}]},
		 "receipts":[{"transactionHash":%q,"status":"0x1","logs":[]},
		  {"transactionHash":%q,"status":"0x1","logs":[{"address":%q,"topics":[%q,%q,%q],"data":"0x%064x","blockNumber":"0x10","blockHash":%q,"transactionHash":%q,"logIndex":"0x3","removed":false}]}]}],
		 "metadata":{"network":"ethereum-mainnet","dataset":"block_with_receipts","blocks_reorged":%s}}`,
			blockHash, txNative, to, txNative, txToken, usdc, quicknode.TransferTopic, from, toTopic, 7, blockHash, txToken, reorged))
	}
	p, err := quicknode.Decode(body("null"))
	require.NoError(t, err)
	transfers, ignored := quicknode.Transfers(p, registry())
	require.Len(t, transfers, 2, "%+v", ignored)
	for _, tr := range transfers {
		require.Equal(t, strings.ToLower(blockHash), tr.BlockHash, tr.EventID())
	}

	p, err = quicknode.Decode(body("[16]"))
	require.NoError(t, err)
	transfers, _ = quicknode.Transfers(p, registry())
	require.Len(t, transfers, 2)
	for _, tr := range transfers {
		require.True(t, tr.Removed && tr.Reorged, tr.EventID())
		require.Empty(t, tr.BlockHash, tr.EventID())
	}
}

// A block whose number does not read cannot be weighed against
// blocks_reorged, so its value transfers are malformed, not transfers of
// block 0.
func TestNativeTransferOfAnUnreadableBlockNumber(t *testing.T) {
	for _, number := range []string{`"0xZZ"`, `"16"`, `"0x"`, `"0x1ffffffffffffffff"`} {
		body := fmt.Sprintf(`{"data":[{"block":{"number":%s,"hash":"0xab","transactions":[{"hash":%q,"to":%q,"value":"0x5"}]},
		 "receipts":[{"transactionHash":%q,"status":"0x1","logs":[]}]}],
		 "metadata":{"network":"ethereum-mainnet","dataset":"block_with_receipts","blocks_reorged":[0]}}`, number, txNative, to, txNative)
		p, err := quicknode.Decode([]byte(body))
		require.NoError(t, err, number)
		transfers, ignored := quicknode.Transfers(p, registry())
		require.Empty(t, transfers, number)
		require.Len(t, ignored, 1, number)
		require.Equal(t, payment.IgnoreMalformed, ignored[0].Reason, number)
	}
}
