package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const (
	alchemyTx        = "0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72"
	alchemyRecipient = "0xbe3f4b43db5eb49d1f48f53443b9abce45da3b79"
	unknownRecipient = "0x7a250d5630b4cf539739df2c5dacb4c659f2488d"
	ethEventID       = "chain:ETH_MAINNET:" + alchemyTx + ":native"
	usdcEventID      = "chain:ETH_MAINNET:" + alchemyTx + ":110"
)

// The acceptance case: an ETH transfer, a USDC transfer, an NFT, a token
// whose symbol is "USDC" at a foreign contract, and a transfer to an
// address that is registered only on another network → exactly two
// deposits with exact amounts; a redelivery changes nothing.
func TestAlchemyAcceptancePayload(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	h.createUser(8)
	// The unknown recipient belongs to someone, but on another network.
	execSQL(t, h.dsn, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('SEPETH', 'ETH_SEPOLIA', NULL, 18)`)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", "0x"+strings.ToUpper(alchemyRecipient[2:])).status)
	require.Equal(t, http.StatusCreated, h.addAddress(8, "ETH_SEPOLIA", unknownRecipient).status)

	body, err := os.ReadFile("testdata/alchemy-acceptance.json")
	require.NoError(t, err)
	r := h.postAlchemy(body, alchemyKey, httpapi.HeaderAlchemyRequestID, "alchemy-delivery-1")
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, map[string]any{
		"status": "accepted", "accepted": 2.0, "duplicates": 0.0, "reopened": 0.0, "rechecked": 0.0, "reversed": 0.0, "ignored": 3.0,
		"trace_id": "alchemy-delivery-1",
	}, r.body)
	require.Equal(t, 2, h.countEvents())

	ctx := context.Background()
	eth, err := h.db.Event(ctx, ethEventID)
	require.NoError(t, err)
	require.Equal(t, payment.Deposit, eth.Type)
	require.Equal(t, int64(7), eth.UserID)
	require.Equal(t, "ETH", eth.Asset)
	require.Equal(t, "1.000000000000000001", eth.Amount.String(), "from rawValue, not the float value 1.0")
	require.Equal(t, alchemyTx, eth.TxHash)
	require.Equal(t, string(postgres.SourceAlchemy), eth.Source)
	require.Equal(t, "alchemy-delivery-1", eth.TraceID)
	require.Equal(t, payment.StatusPending, eth.Status)

	usdc, err := h.db.Event(ctx, usdcEventID)
	require.NoError(t, err)
	require.Equal(t, "USDC", usdc.Asset)
	require.Equal(t, "293.092129", usdc.Amount.String())
	require.Equal(t, int64(7), usdc.UserID)
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM payment_events WHERE event_id = $1 AND to_address = $2", usdcEventID, alchemyRecipient))

	again := h.postAlchemy(body, alchemyKey2)
	require.Equal(t, http.StatusOK, again.status, "%s", again.raw)
	require.Equal(t, 0.0, again.body["accepted"])
	require.Equal(t, 2.0, again.body["duplicates"])
	require.Equal(t, 3.0, again.body["ignored"])
	require.Equal(t, 2, h.countEvents(), "a redelivery changes nothing")
	eth2, err := h.db.Event(ctx, ethEventID)
	require.NoError(t, err)
	require.Equal(t, eth.Amount.String(), eth2.Amount.String())
	require.Equal(t, eth.TraceID, eth2.TraceID)

	outcomes := map[string]string{"source": "alchemy", "outcome": "ignored"}
	for reason, want := range map[string]float64{"nft": 2, "unknown_asset": 2, "unknown_address": 2} {
		outcomes["reason"] = reason
		require.Equal(t, want, counter(t, h.metrics, "settle_api_webhook_outcomes_total", outcomes), reason)
	}
}

// tokenPayload is one USDC transfer to the recipient, optionally removed.
func tokenPayload(t *testing.T, logIndex string, removed bool) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"webhookId": "wh_1", "id": "whevt_1", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{
			"network": "ETH_MAINNET",
			"activity": []any{map[string]any{
				"hash": alchemyTx, "toAddress": alchemyRecipient, "category": "token", "value": 1.5, "asset": "USDC",
				"rawContract": map[string]any{"rawValue": "0x16e360", "address": "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", "decimals": 6},
				"log":         map[string]any{"address": "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", "logIndex": logIndex, "removed": removed},
			}},
		},
	})
	require.NoError(t, err)
	return body
}

// A log Alchemy reports as removed reverses its deposit (uncredited: it
// fails with outcome reorged); a removal of an unknown deposit is ignored.
func TestAlchemyRemovedLogReversesDeposit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)

	r := h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"
	e, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "1.5", e.Amount.String())

	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["reversed"])
	require.Equal(t, 0.0, r.body["accepted"])
	e, err = h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)

	r = h.postAlchemy(tokenPayload(t, "0x2", true), alchemyKey)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, 0.0, r.body["reversed"])
	require.Equal(t, 1.0, r.body["ignored"], "removal of a deposit never stored")
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "alchemy", "reason": "removed_unknown"}))
	require.Equal(t, 1, h.countEvents())
}

func TestAlchemySignatureAndConfiguration(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := tokenPayload(t, "0x1", false)
	requireError(t, h.do(http.MethodPost, "/webhook/alchemy", body, nil), http.StatusUnauthorized)
	requireError(t, h.postAlchemy(body, "whsec_unknown"), http.StatusUnauthorized)
	// The whsec_ prefix is part of the key.
	requireError(t, h.postAlchemy(body, strings.TrimPrefix(alchemyKey, "whsec_")), http.StatusUnauthorized)
	// Either configured key passes; the payments secret does not.
	require.Equal(t, http.StatusOK, h.postAlchemy(body, alchemyKey).status)
	require.Equal(t, http.StatusOK, h.postAlchemy(body, alchemyKey2).status)
	requireError(t, h.postAlchemy(body, webhookSecret), http.StatusUnauthorized)
	// A signed body that is not an Alchemy payload is a 400.
	requireError(t, h.postAlchemy([]byte(`{"event":"nope"}`), alchemyKey), http.StatusBadRequest)
	requireError(t, h.postAlchemy([]byte(`not json`), alchemyKey), http.StatusBadRequest)

	// Without a signing key the route does not exist.
	off := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.AlchemySigningKeys = nil }})
	requireError(t, off.postAlchemy(body, alchemyKey), http.StatusNotFound)
}

// TestTokenListedElsewhereIsCreditedAtOnce: a token another replica (or
// settlectl) listed after this api read the registry is credited when a
// provider reports it, not answered ignored (which ends the provider's
// retries): a miss reads the registry again, at most every 5 s.
func TestTokenListedElsewhereIsCreditedAtOnce(t *testing.T) {
	var clock atomic.Int64 // seconds past fixedNow
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.RegistryRefresh = time.Hour
		o.Now = func() time.Time { return fixedNow.Add(time.Duration(clock.Load()) * time.Second) }
	}})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	r := h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw) // the registry is read

	const contract = "0x00000000000000000000000000000000000cafe1"
	_, err := h.db.AddAsset(context.Background(), payment.Asset{Code: "MYT", Network: "ETH_MAINNET", Contract: contract, Decimals: 6})
	require.NoError(t, err)
	clock.Store(6) // past the miss interval since that read
	body, err := json.Marshal(map[string]any{
		"webhookId": "wh_1", "id": "whevt_2", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{map[string]any{
			"hash": "0x" + strings.Repeat("cd", 32), "toAddress": alchemyRecipient, "category": "token", "value": 2, "asset": "MYT",
			"rawContract": map[string]any{"rawValue": "0x1e8480", "address": contract, "decimals": 6},
			"log":         map[string]any{"address": contract, "logIndex": "0x0", "removed": false},
		}}},
	})
	require.NoError(t, err)
	r = h.postAlchemy(body, alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	e, err := h.db.Event(context.Background(), "chain:ETH_MAINNET:0x"+strings.Repeat("cd", 32)+":0")
	require.NoError(t, err)
	require.Equal(t, "MYT", e.Asset)
	require.Equal(t, "2", e.Amount.String())
}
