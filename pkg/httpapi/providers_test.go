package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/quicknode"
)

const (
	quickNodeToken = "qn-token-0123456789"
	moralisSecret  = "moralis-secret-0123456789"
	usdcContract   = "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"
)

func providerHarness(t *testing.T) *harness {
	return newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.QuickNodeTokens = []string{quickNodeToken}
		o.MoralisSecrets = []string{moralisSecret}
	}})
}

// quickNodeLogs is a logs delivery of one USDC Transfer to the
// recipient, in block 0x10, which blocks_reorged may list.
func quickNodeLogs(logIndex string, reorged bool) []byte {
	reorgedBlocks := "null"
	if reorged {
		reorgedBlocks = "[16]"
	}
	return []byte(fmt.Sprintf(`{"data":[[{"address":%q,"topics":[%q,"0x0000000000000000000000009999999999999999999999999999999999999999","0x000000000000000000000000%s"],"data":"0x%064x","blockNumber":"0x10","transactionHash":%q,"logIndex":%q,"removed":false}]],"metadata":{"network":"ethereum-mainnet","dataset":"logs","blocks_reorged":%s}}`,
		usdcContract, quicknode.TransferTopic, alchemyRecipient[2:], 1_500_000, alchemyTx, logIndex, reorgedBlocks))
}

func (h *harness) postQuickNode(body []byte, sent time.Time, gz bool) response {
	h.t.Helper()
	ts := strconv.FormatInt(sent.Unix(), 10)
	hdr := map[string]string{"Content-Type": "application/json", httpapi.HeaderQuickNodeNonce: "abc", httpapi.HeaderQuickNodeTimestamp: ts,
		httpapi.HeaderQuickNodeSignature: quicknode.Sign("abc", ts, body, []byte(quickNodeToken))}
	if gz {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = buf.Bytes()
		hdr["Content-Encoding"] = "gzip"
	}
	return h.do(http.MethodPost, "/webhook/quicknode", body, hdr)
}

// Without their secrets the provider routes do not exist, by any method.
func TestProviderRoutesNeedTheirSecrets(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.AlchemySigningKeys = nil }})
	for _, path := range []string{"/webhook/alchemy", "/webhook/quicknode", "/webhook/moralis"} {
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodPut} {
			requireCode(t, h.do(method, path, []byte(`{}`), nil), http.StatusNotFound, httpapi.CodeNotFound)
		}
	}
	// With one, a wrong method is a 405, as on any route.
	on := newHarness(t, harnessOptions{})
	requireCode(t, on.do(http.MethodGet, "/webhook/alchemy", nil, nil), http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
}

// A QuickNode delivery through the intake: accepted once, a duplicate
// after, a blocks_reorged report reverses it (no RPC here: the report is
// the evidence); deliveries are counted per provider and result.
func TestQuickNodeIntake(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)

	r := h.postQuickNode(quickNodeLogs("0x1", false), fixedNow, true)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"
	e, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "1.5", e.Amount.String())
	require.Equal(t, "quicknode", e.Source)

	r = h.postQuickNode(quickNodeLogs("0x1", false), fixedNow.Add(-time.Minute), false)
	require.Equal(t, 0.0, r.body["accepted"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["duplicates"])

	requireCode(t, h.postQuickNode(quickNodeLogs("0x1", false), fixedNow.Add(-6*time.Minute), false), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	requireCode(t, h.postQuickNode(quickNodeLogs("0x1", false), fixedNow.Add(2*time.Minute), false), http.StatusUnauthorized, httpapi.CodeInvalidSignature)

	r = h.postQuickNode(quickNodeLogs("0x1", true), fixedNow, false)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
	e, err = h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)

	require.Equal(t, 3.0, counter(t, h.metrics, "settle_provider_deliveries_total", map[string]string{"provider": "quicknode", "result": "accepted"}))
	require.Equal(t, 2.0, counter(t, h.metrics, "settle_provider_deliveries_total", map[string]string{"provider": "quicknode", "result": "invalid_signature"}))
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "quicknode", "outcome": "accepted"}))
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "quicknode", "outcome": "duplicate"}))
	require.Equal(t, 1, h.countEvents())
}

// A body over the limit once decompressed is a 413, whatever its wire
// size; an unknown Content-Encoding is a 400.
func TestQuickNodeDecompressedLimit(t *testing.T) {
	h := providerHarness(t)
	big := []byte(`{"data":[],"metadata":{"network":"ethereum-mainnet","dataset":"logs","pad":"` + strings.Repeat("x", httpapi.ProviderBodyMaxDefault) + `"}}`)
	requireCode(t, h.postQuickNode(big, fixedNow, true), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
	small := quickNodeLogs("0x1", false)
	ts := strconv.FormatInt(fixedNow.Unix(), 10)
	r := h.do(http.MethodPost, "/webhook/quicknode", small, map[string]string{"Content-Encoding": "br",
		httpapi.HeaderQuickNodeNonce: "abc", httpapi.HeaderQuickNodeTimestamp: ts,
		httpapi.HeaderQuickNodeSignature: quicknode.Sign("abc", ts, small, []byte(quickNodeToken))})
	requireCode(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest)
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_provider_deliveries_total", map[string]string{"provider": "quicknode", "result": "body_too_large"}))
	require.Equal(t, 0, h.countEvents())
}

// Moralis through the intake: the test delivery stores nothing; the two
// deliveries of a transfer are one event; a network not enabled here is
// ignored and counted.
func TestMoralisIntake(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	post := func(body string) response {
		sig, err := moralis.Sign([]byte(body), []byte(moralisSecret))
		require.NoError(t, err)
		return h.do(http.MethodPost, "/webhook/moralis", []byte(body), map[string]string{httpapi.HeaderMoralisSignature: sig})
	}
	r := post(`{"abi":{},"block":{"hash":"","number":"","timestamp":""},"txs":[],"txsInternal":[],"logs":[],"chainId":"","tag":"","streamId":"","confirmed":true,"retries":0,"erc20Approvals":[],"erc20Transfers":[],"nftApprovals":[],"nftTransfers":[]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 0.0, r.body["accepted"])
	require.Equal(t, 0, h.countEvents())

	delivery := func(chain string, confirmed bool) string {
		return fmt.Sprintf(`{ "confirmed" : %v, "chainId" : %q, "block": {"number": "16"},
		  "erc20Transfers": [ {"transactionHash": %q, "logIndex": "1", "contract": %q, "to": %q, "value": "1500000", "valueWithDecimals": "999"} ] }`,
			confirmed, chain, alchemyTx, usdcContract, alchemyRecipient)
	}
	r = post(delivery("0x1", false))
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = post(delivery("0x1", true))
	require.Equal(t, 0.0, r.body["accepted"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["duplicates"])
	e, err := h.db.Event(context.Background(), "chain:ETH_MAINNET:"+alchemyTx+":1")
	require.NoError(t, err)
	require.Equal(t, "1.5", e.Amount.String())
	require.Equal(t, "moralis", e.Source)

	r = post(delivery("0x2105", true))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["ignored"], "%s", r.raw)
	requireCode(t, h.do(http.MethodPost, "/webhook/moralis", []byte(delivery("0x1", true)), map[string]string{httpapi.HeaderMoralisSignature: "0x" + strings.Repeat("0", 64)}),
		http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	require.Equal(t, 1, h.countEvents())
}
