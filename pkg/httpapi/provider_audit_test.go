package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/quicknode"
	"github.com/settle/settle/pkg/testenv"
)

func auditBlockHash(n int) string { return fmt.Sprintf("0x%064x", 0xb10c000+n) }

// alchemyTokenIn is Alchemy's report of the USDC transfer (log 1) in
// block n, removed or not, as Alchemy writes a token log: with its block.
func alchemyTokenIn(t *testing.T, n int, removed bool) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"webhookId": "wh_1", "id": "whevt_1", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{
			"network": "ETH_MAINNET",
			"activity": []any{map[string]any{
				"hash": alchemyTx, "toAddress": alchemyRecipient, "category": "token",
				"rawContract": map[string]any{"rawValue": "0x16e360", "address": usdcContract, "decimals": 6},
				"log": map[string]any{"address": usdcContract, "logIndex": "0x1", "removed": removed,
					"transactionHash": alchemyTx, "blockHash": auditBlockHash(n), "blockNumber": "0x10"},
			}},
		},
	})
	require.NoError(t, err)
	return body
}

// quickNodeTokenIn is QuickNode's logs delivery of the same transfer in
// block n (the log names its block, as eth_getLogs writes it).
func quickNodeTokenIn(n int) []byte {
	return []byte(fmt.Sprintf(`{"data":[[{"address":%q,"topics":[%q,"0x0000000000000000000000009999999999999999999999999999999999999999","0x000000000000000000000000%s"],"data":"0x%064x","blockNumber":"0x10","blockHash":%q,"transactionHash":%q,"logIndex":"0x1","removed":false}]],"metadata":{"network":"ethereum-mainnet","dataset":"logs"}}`,
		usdcContract, quicknode.TransferTopic, alchemyRecipient[2:], 1_500_000, auditBlockHash(n), alchemyTx))
}

// moralisTokenIn is Moralis's delivery of the same transfer in block n.
func moralisTokenIn(n int, confirmed bool) []byte {
	return []byte(fmt.Sprintf(`{"confirmed":%v,"chainId":"0x1","streamId":"s","block":{"number":"16","hash":%q,"timestamp":"1"},"txs":[],"txsInternal":[],"erc20Transfers":[{"transactionHash":%q,"logIndex":"1","contract":%q,"from":"0x9999999999999999999999999999999999999999","to":%q,"value":"1500000"}]}`,
		confirmed, auditBlockHash(n), alchemyTx, usdcContract, alchemyRecipient))
}

func (h *harness) postMoralis(body []byte) response {
	h.t.Helper()
	sig, err := moralis.Sign(body, []byte(moralisSecret))
	require.NoError(h.t, err)
	return h.do(http.MethodPost, "/webhook/moralis", body, map[string]string{httpapi.HeaderMoralisSignature: sig})
}

func (h *harness) usdcBalance(user int64) string {
	h.t.Helper()
	balances, err := h.db.Balances(context.Background(), user)
	require.NoError(h.t, err)
	for _, b := range balances {
		if b.Asset == "USDC" {
			return b.Balance.String()
		}
	}
	return "0"
}

// Without an RPC the providers' reports are the evidence, and they may
// arrive in any order: Alchemy reports a transfer in block 1, then its
// removal by a reorg. A late delivery of block 1 by QuickNode or Moralis
// (a retry of one that failed before the reorg) names that removed block:
// it is stale and must not reopen and credit the deposit, just as
// Alchemy's own late redelivery does not. Reported in another block, the
// transfer is on the chain again and is credited.
func TestStaleReportOfARemovedBlockFromAnotherProvider(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	r := h.postAlchemy(alchemyTokenIn(t, 1, false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = h.postAlchemy(alchemyTokenIn(t, 1, true), alchemyKey)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
	testenv.SettleOutbox(t, h.db)
	require.Equal(t, "0", h.usdcBalance(7))

	stale := map[string]func() response{
		"alchemy":   func() response { return h.postAlchemy(alchemyTokenIn(t, 1, false), alchemyKey) },
		"quicknode": func() response { return h.postQuickNode(quickNodeTokenIn(1), fixedNow, false) },
		"moralis":   func() response { return h.postMoralis(moralisTokenIn(1, false)) },
	}
	for _, provider := range []string{"alchemy", "quicknode", "moralis"} {
		r := stale[provider]()
		require.Equal(t, http.StatusOK, r.status, "%s: %s", provider, r.raw)
		require.Equal(t, 0.0, r.body["reopened"], "%s: a report of the removed block reopens nothing: %s", provider, r.raw)
		e, err := h.db.Event(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, payment.StatusFailed, e.Status, "%s", provider)
		testenv.SettleOutbox(t, h.db)
		require.Equal(t, "0", h.usdcBalance(7), "%s: credited for a transfer only a removed block held", provider)
	}

	// Moralis reports the transfer in the reorg's new block: on the chain.
	r = h.postMoralis(moralisTokenIn(2, true))
	require.Equal(t, 1.0, r.body["reopened"], "%s", r.raw)
	testenv.SettleOutbox(t, h.db)
	require.Equal(t, "1.5", h.usdcBalance(7))
	testenv.RequireInvariants(t, h.db)
}

// One transfer spelled three ways (Alchemy: upper-case hex, a log index
// with a leading zero; QuickNode: lower case; Moralis: the log index as
// a JSON number) is one event; a native transfer of value 0 and an
// amount sent as a JSON number are nothing, from every provider.
func TestProviderSpellingsOfOneTransfer(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	upper := func(s string) string { return "0X" + strings.ToUpper(s[2:]) }
	alchemyBody := func(activity map[string]any) []byte {
		body, err := json.Marshal(map[string]any{"webhookId": "wh_1", "id": "whevt_1", "type": "ADDRESS_ACTIVITY",
			"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{activity}}})
		require.NoError(t, err)
		return body
	}
	r := h.postAlchemy(alchemyBody(map[string]any{
		"hash": upper(alchemyTx), "toAddress": upper(alchemyRecipient), "category": "token", "value": 99.0,
		"rawContract": map[string]any{"rawValue": "0x00000000000000000000000000000000000000000000000000000000016E360", "address": upper(usdcContract)},
		"log":         map[string]any{"address": upper(usdcContract), "logIndex": "0x01", "transactionHash": alchemyTx, "removed": false},
	}), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = h.postQuickNode(quickNodeLogs("0x1", false), fixedNow, false)
	require.Equal(t, 1.0, r.body["duplicates"], "%s", r.raw)
	r = h.postMoralis([]byte(fmt.Sprintf(`{"confirmed":true,"chainId":"0x1","block":{"number":"16"},"erc20Transfers":[{"transactionHash":%q,"logIndex":1,"contract":%q,"to":%q,"value":"1500000"}]}`,
		upper(alchemyTx), upper(usdcContract), upper(alchemyRecipient))))
	require.Equal(t, 1.0, r.body["duplicates"], "%s", r.raw)
	e, err := h.db.Event(context.Background(), "chain:ETH_MAINNET:"+alchemyTx+":1")
	require.NoError(t, err)
	require.Equal(t, "1.5", e.Amount.String())
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM payment_events WHERE event_id = $1 AND to_address = $2 AND tx_hash = $3", e.ID, alchemyRecipient, alchemyTx))
	require.Equal(t, 1, h.countEvents())

	// Value 0, and amounts as JSON numbers: ignored, nothing stored.
	zeroTx := "0x" + strings.Repeat("0d", 32)
	r = h.postAlchemy(alchemyBody(map[string]any{"hash": zeroTx, "toAddress": alchemyRecipient, "category": "external", "rawContract": map[string]any{"rawValue": "0x0"}}), alchemyKey)
	require.Equal(t, 1.0, r.body["ignored"], "%s", r.raw)
	r = h.postAlchemy(alchemyBody(map[string]any{"hash": zeroTx, "toAddress": alchemyRecipient, "category": "external", "rawContract": map[string]any{"rawValue": 1e18}}), alchemyKey)
	require.Equal(t, 1.0, r.body["ignored"], "%s", r.raw)
	r = h.postQuickNode([]byte(fmt.Sprintf(`{"data":[{"block":{"number":"0x10","transactions":[{"hash":%q,"to":%q,"value":"0x00"},{"hash":%q,"to":%q,"value":1000}]},"receipts":[{"transactionHash":%q,"status":"0x1","logs":[]}]}],"metadata":{"network":"ethereum-mainnet","dataset":"block_with_receipts"}}`,
		zeroTx, alchemyRecipient, zeroTx, alchemyRecipient, zeroTx)), fixedNow, false)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 0.0, r.body["accepted"], "%s", r.raw)
	r = h.postMoralis([]byte(fmt.Sprintf(`{"confirmed":true,"chainId":"0x1","block":{"number":"16"},"txs":[{"hash":%q,"toAddress":%q,"value":"000","receiptStatus":"1"},{"hash":%q,"toAddress":%q,"value":1000,"receiptStatus":"1"}],"erc20Transfers":[{"transactionHash":%q,"logIndex":"2","contract":%q,"to":%q,"value":1500000}]}`,
		zeroTx, alchemyRecipient, zeroTx, alchemyRecipient, zeroTx, usdcContract, alchemyRecipient)))
	require.Equal(t, 3.0, r.body["ignored"], "%s", r.raw)
	require.Equal(t, 1, h.countEvents())
}

// Alchemy's signature covers the raw bytes: the header name in any case
// and the hex in upper case are accepted; the same JSON re-spaced, a
// prefixed or empty signature, or another key's are not.
func TestAlchemySignatureEdges(t *testing.T) {
	h := providerHarness(t)
	body := tokenPayload(t, "0x1", false)
	sig := alchemy.Sign(body, []byte(alchemyKey))
	post := func(b []byte, header, value string) response {
		return h.do(http.MethodPost, "/webhook/alchemy", b, map[string]string{"Content-Type": "application/json", header: value})
	}
	require.Equal(t, http.StatusOK, post(body, "x-alchemy-signature", strings.ToUpper(sig)).status)
	var v any
	require.NoError(t, json.Unmarshal(body, &v))
	spaced, err := json.MarshalIndent(v, "", " ")
	require.NoError(t, err)
	for name, r := range map[string]response{
		"re-spaced body": post(spaced, httpapi.HeaderAlchemySignature, sig),
		"sha256= prefix": post(body, httpapi.HeaderAlchemySignature, "sha256="+sig),
		"0x prefix":      post(body, httpapi.HeaderAlchemySignature, "0x"+sig),
		"empty":          post(body, httpapi.HeaderAlchemySignature, ""),
		"other key":      post(body, httpapi.HeaderAlchemySignature, alchemy.Sign(body, []byte("whsec_other"))),
		"empty key":      post(body, httpapi.HeaderAlchemySignature, alchemy.Sign(body, nil)),
		"payments key":   post(body, httpapi.HeaderAlchemySignature, alchemy.Sign(body, []byte(webhookSecret))),
	} {
		require.Equal(t, http.StatusUnauthorized, r.status, "%s: %s", name, r.raw)
	}
	require.Equal(t, 0, h.countEvents())
}

// A delivery past a decoder's item bound is refused whole (400) before
// anything is stored, even with a good transfer first: never half
// accepted, then retried.
func TestOversizedDeliveriesStoreNothing(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	junk := func(n int) string { return strings.TrimSuffix(strings.Repeat("{},", n), ",") }

	good := tokenPayload(t, "0x1", false)
	alchemyBody := strings.Replace(string(good), `"value":1.5}]`, `"value":1.5},`+junk(alchemy.ActivitiesMax)+`]`, 1)
	require.NotEqual(t, string(good), alchemyBody)
	requireCode(t, h.postAlchemy([]byte(alchemyBody), alchemyKey), http.StatusBadRequest, httpapi.CodeInvalidRequest)

	logs := string(quickNodeLogs("0x1", false))
	quickNodeBody := strings.Replace(logs, `"removed":false}]]`, `"removed":false},`+junk(quicknode.ItemsMax)+`]]`, 1)
	require.NotEqual(t, logs, quickNodeBody)
	requireCode(t, h.postQuickNode([]byte(quickNodeBody), fixedNow, true), http.StatusBadRequest, httpapi.CodeInvalidRequest)

	moralisBody := fmt.Sprintf(`{"confirmed":true,"chainId":"0x1","block":{"number":"16"},"erc20Transfers":[{"transactionHash":%q,"logIndex":"1","contract":%q,"to":%q,"value":"1500000"}],"txs":[%s]}`,
		alchemyTx, usdcContract, alchemyRecipient, junk(moralis.ItemsMax))
	requireCode(t, h.postMoralis([]byte(moralisBody)), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	require.Equal(t, 0, h.countEvents())

	// The good transfer alone is taken.
	require.Equal(t, 1.0, h.postAlchemy(good, alchemyKey).body["accepted"])
}

// A delivery whose storage fails after some of its transfers are stored
// is answered 503, and the provider's retry completes it: the stored half
// counts as duplicates, nothing is stored twice, and every transfer ends
// reported by its provider once.
func TestDeliveryFailingHalfwayIsCompletedByTheRetry(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	second := "chain:ETH_MAINNET:" + alchemyTx + ":2"
	execSQL(t, h.dsn, `CREATE FUNCTION audit_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.event_id = '`+second+`' THEN RAISE EXCEPTION 'audit outage' USING ERRCODE = '57P01'; END IF;
  RETURN NEW;
END $$`)
	execSQL(t, h.dsn, `CREATE TRIGGER audit_fail BEFORE INSERT ON payment_events FOR EACH ROW EXECUTE FUNCTION audit_fail()`)

	var one, two map[string]any
	require.NoError(t, json.Unmarshal(tokenPayload(t, "0x1", false), &one))
	require.NoError(t, json.Unmarshal(tokenPayload(t, "0x2", false), &two))
	activities := one["event"].(map[string]any)["activity"].([]any)
	one["event"].(map[string]any)["activity"] = append(activities, two["event"].(map[string]any)["activity"].([]any)...)
	body, err := json.Marshal(one)
	require.NoError(t, err)

	r := h.postAlchemy(body, alchemyKey)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.raw)
	require.Equal(t, 1, h.countEvents(), "the first transfer was stored before the failure")

	execSQL(t, h.dsn, `DROP TRIGGER audit_fail ON payment_events`)
	r = h.postAlchemy(body, alchemyKey)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["duplicates"], "%s", r.raw)
	require.Equal(t, 2, h.countEvents())
	require.Equal(t, 2, countRows(t, h.dsn, `SELECT count(*) FROM transfer_reports WHERE reporter = 'alchemy'`))
	testenv.SettleOutbox(t, h.db)
	require.Equal(t, "3", h.usdcBalance(7))
}

// A network another replica (or settlectl) added after this api read the
// registry: Moralis names it only by chain id, and its first deposits are
// credited, not answered ignored (which ends Moralis's retries for
// good), just as a token listed elsewhere is (a miss reads the registry
// again, at most every 5 s).
func TestMoralisNetworkAddedElsewhereIsCreditedAtOnce(t *testing.T) {
	var clock atomic.Int64 // seconds past fixedNow
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.MoralisSecrets = []string{moralisSecret}
		o.Networks = []string{"ETH_MAINNET", "MY_DEVNET"}
		o.RegistryRefresh = time.Hour
		o.Now = func() time.Time { return fixedNow.Add(time.Duration(clock.Load()) * time.Second) }
	}})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	r := h.postMoralis(moralisTokenIn(1, true))
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw) // the registry is read

	ctx := context.Background()
	_, err := h.db.AddNetwork(ctx, postgres.NewNetwork{Name: "MY_DEVNET", ChainID: 31337, Native: "ETH", Decimals: 18})
	require.NoError(t, err)
	_, err = h.db.AddDepositAddress(ctx, "MY_DEVNET", alchemyRecipient, 7)
	require.NoError(t, err)
	clock.Store(6) // past the miss interval since that read
	tx := "0x" + strings.Repeat("de", 32)
	r = h.postMoralis([]byte(fmt.Sprintf(`{"confirmed":true,"chainId":"0x7a69","block":{"number":"5"},"txs":[{"hash":%q,"toAddress":%q,"value":"2000000000000000000","receiptStatus":"1"}]}`, tx, alchemyRecipient)))
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	e, err := h.db.Event(ctx, "chain:MY_DEVNET:"+tx+":native")
	require.NoError(t, err)
	require.Equal(t, "2", e.Amount.String())
}
