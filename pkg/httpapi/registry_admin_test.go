package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
)

func (h *harness) postAdmin(path string, fields map[string]any) response {
	h.t.Helper()
	body, err := json.Marshal(fields)
	require.NoError(h.t, err)
	return h.do(http.MethodPost, path, body, bearer(adminToken))
}

// requireRefused is an error answer with its code.
func requireRefused(t *testing.T, r response, status int, code string) {
	t.Helper()
	requireError(t, r, status)
	require.Equal(t, code, r.body["code"], "body %s", r.raw)
}

func TestAdminAddNetwork(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	devnet := map[string]any{"name": "DEVNET", "chain_id": 31337, "native": "DEV", "decimals": 18}

	for _, headers := range []map[string]string{nil, bearer(apiToken)} {
		requireRefused(t, h.do(http.MethodPost, "/admin/networks", []byte(`{"name":"DEVNET","chain_id":31337,"native":"DEV","decimals":18}`), headers),
			http.StatusUnauthorized, httpapi.CodeUnauthorized)
	}

	r := h.postAdmin("/admin/networks", devnet)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, "added", r.body["status"])
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM networks WHERE name = 'DEVNET' AND chain_id = 31337 AND native_asset = 'DEV'`))
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM network_assets WHERE network = 'DEVNET' AND asset = 'DEV' AND contract_address IS NULL AND decimals = 18`),
		"the native coin is listed with its decimals")
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM assets WHERE code = 'DEV'`), "a new native code becomes a ledger asset")

	r = h.postAdmin("/admin/networks", devnet)
	require.Equal(t, http.StatusOK, r.status, "the same network again: %s", r.raw)
	require.Equal(t, "exists", r.body["status"])

	for name, fields := range map[string]map[string]any{
		"name taken, other chain id":  {"name": "DEVNET", "chain_id": 31338, "native": "DEV", "decimals": 18},
		"name taken, other native":    {"name": "DEVNET", "chain_id": 31337, "native": "ETH", "decimals": 18},
		"name taken, other decimals":  {"name": "DEVNET", "chain_id": 31337, "native": "DEV", "decimals": 6},
		"chain id of ETH_MAINNET":     {"name": "FORK", "chain_id": 1, "native": "ETH", "decimals": 18},
		"ETH with 6 decimals on BASE": {"name": "BASE_MAINNET", "chain_id": 8453, "native": "ETH", "decimals": 6},
	} {
		t.Run(name, func(t *testing.T) {
			requireRefused(t, h.postAdmin("/admin/networks", fields), http.StatusConflict, httpapi.CodeConflict)
		})
	}

	for name, body := range map[string]string{
		"lowercase name":      `{"name":"devnet","chain_id":5,"native":"DEV","decimals":18}`,
		"name too long":       `{"name":"N` + repeat("A", 64) + `","chain_id":5,"native":"DEV","decimals":18}`,
		"name with a dash":    `{"name":"DEV-NET","chain_id":5,"native":"DEV","decimals":18}`,
		"missing name":        `{"chain_id":5,"native":"DEV","decimals":18}`,
		"chain id zero":       `{"name":"NEWNET","chain_id":0,"native":"DEV","decimals":18}`,
		"chain id negative":   `{"name":"NEWNET","chain_id":-5,"native":"DEV","decimals":18}`,
		"chain id a string":   `{"name":"NEWNET","chain_id":"5","native":"DEV","decimals":18}`,
		"chain id a fraction": `{"name":"NEWNET","chain_id":5.5,"native":"DEV","decimals":18}`,
		"chain id too big":    `{"name":"NEWNET","chain_id":99999999999999999999,"native":"DEV","decimals":18}`,
		"native lowercase":    `{"name":"NEWNET","chain_id":5,"native":"dev","decimals":18}`,
		"native too long":     `{"name":"NEWNET","chain_id":5,"native":"ABCDEFGHIJKLMNOPQ","decimals":18}`,
		"missing native":      `{"name":"NEWNET","chain_id":5,"decimals":18}`,
		"decimals 19":         `{"name":"NEWNET","chain_id":5,"native":"DEV","decimals":19}`,
		"decimals negative":   `{"name":"NEWNET","chain_id":5,"native":"DEV","decimals":-1}`,
		"decimals a string":   `{"name":"NEWNET","chain_id":5,"native":"DEV","decimals":"18"}`,
		"decimals 06":         `{"name":"NEWNET","chain_id":5,"native":"DEV","decimals":06}`,
		"missing decimals":    `{"name":"NEWNET","chain_id":5,"native":"DEV"}`,
		"repeated member":     `{"name":"NEWNET","name":"OTHER","chain_id":5,"native":"DEV","decimals":18}`,
		"malformed":           `{"name":`,
		"an array":            `[]`,
	} {
		t.Run(name, func(t *testing.T) {
			requireRefused(t, h.do(http.MethodPost, "/admin/networks", []byte(body), bearer(adminToken)), http.StatusBadRequest, httpapi.CodeInvalidRequest)
		})
	}
	require.Equal(t, 0, countRows(t, h.dsn, `SELECT count(*) FROM networks WHERE name IN ('NEWNET', 'FORK', 'OTHER')`))
}

func TestAdminAddAsset(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	mixed := "0x5FbDB2315678afecb367f032d93F642f64180aa3"
	lower := "0x5fbdb2315678afecb367f032d93f642f64180aa3"
	token := map[string]any{"network": "BASE_MAINNET", "asset": "NEWT", "contract": mixed, "decimals": 6}

	requireRefused(t, h.do(http.MethodPost, "/admin/assets", []byte(`{}`), bearer(apiToken)), http.StatusUnauthorized, httpapi.CodeUnauthorized)

	r := h.postAdmin("/admin/assets", token)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, "added", r.body["status"])
	require.Equal(t, lower, r.body["contract"], "stored lowercase")
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM network_assets WHERE network = 'BASE_MAINNET' AND asset = 'NEWT' AND contract_address = $1 AND decimals = 6`, lower))

	// The same listing again, in any letter case, is not an error.
	token["contract"] = lower
	r = h.postAdmin("/admin/assets", token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "exists", r.body["status"])

	// The same code elsewhere, with that network's own decimals.
	r = h.postAdmin("/admin/assets", map[string]any{"network": "ETH_MAINNET", "asset": "NEWT", "contract": "0x" + repeat("ab", 20), "decimals": 18})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)

	for name, fields := range map[string]map[string]any{
		"another code at the contract":     {"network": "BASE_MAINNET", "asset": "OTHER", "contract": lower, "decimals": 6},
		"the code with other decimals":     {"network": "BASE_MAINNET", "asset": "NEWT", "contract": lower, "decimals": 18},
		"the code at another contract":     {"network": "BASE_MAINNET", "asset": "NEWT", "contract": "0x" + repeat("cd", 20), "decimals": 6},
		"USDC's contract under a new code": {"network": "BASE_MAINNET", "asset": "USDX", "contract": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", "decimals": 6},
		"a second native coin":             {"network": "BASE_MAINNET", "asset": "WEI", "decimals": 18},
	} {
		t.Run(name, func(t *testing.T) {
			requireRefused(t, h.postAdmin("/admin/assets", fields), http.StatusConflict, httpapi.CodeConflict)
		})
	}

	r = h.postAdmin("/admin/assets", map[string]any{"network": "NOWHERE", "asset": "NEWT", "contract": lower, "decimals": 6})
	requireRefused(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest)
	require.Contains(t, r.body["error"], "NOWHERE")

	for name, body := range map[string]string{
		"short contract":      `{"network":"BASE_MAINNET","asset":"NEWT","contract":"0x1234","decimals":6}`,
		"contract without 0x": `{"network":"BASE_MAINNET","asset":"NEWT","contract":"` + repeat("ab", 21) + `","decimals":6}`,
		"contract not hex":    `{"network":"BASE_MAINNET","asset":"NEWT","contract":"0x` + repeat("zz", 20) + `","decimals":6}`,
		"contract empty":      `{"network":"BASE_MAINNET","asset":"NEWT","contract":"","decimals":6}`,
		"contract a number":   `{"network":"BASE_MAINNET","asset":"NEWT","contract":5,"decimals":6}`,
		"asset lowercase":     `{"network":"BASE_MAINNET","asset":"newt","contract":"` + lower + `","decimals":6}`,
		"asset with a dash":   `{"network":"BASE_MAINNET","asset":"NE-WT","contract":"` + lower + `","decimals":6}`,
		"asset too long":      `{"network":"BASE_MAINNET","asset":"ABCDEFGHIJKLMNOPQ","contract":"` + lower + `","decimals":6}`,
		"missing asset":       `{"network":"BASE_MAINNET","contract":"` + lower + `","decimals":6}`,
		"network lowercase":   `{"network":"base_mainnet","asset":"NEWT","contract":"` + lower + `","decimals":6}`,
		"missing network":     `{"asset":"NEWT","contract":"` + lower + `","decimals":6}`,
		"decimals 19":         `{"network":"BASE_MAINNET","asset":"NEWT","contract":"` + lower + `","decimals":19}`,
		"decimals 6.0":        `{"network":"BASE_MAINNET","asset":"NEWT","contract":"` + lower + `","decimals":6.0}`,
		"missing decimals":    `{"network":"BASE_MAINNET","asset":"NEWT","contract":"` + lower + `"}`,
		"malformed":           `{"network":`,
	} {
		t.Run(name, func(t *testing.T) {
			requireRefused(t, h.do(http.MethodPost, "/admin/assets", []byte(body), bearer(adminToken)), http.StatusBadRequest, httpapi.CodeInvalidRequest)
		})
	}
	require.Equal(t, 0, countRows(t, h.dsn, `SELECT count(*) FROM assets WHERE code IN ('OTHER', 'USDX', 'WEI')`), "a refused listing adds no ledger code")
	require.Equal(t, 2, countRows(t, h.dsn, `SELECT count(*) FROM network_assets WHERE asset = 'NEWT'`))
}

// TestAdminAddAssetContractField: network_assets' column name
// (CONTRACT.md, Networks) lists the token at that contract, and a field
// the api does not read is refused, never taken for "no contract": on a
// network without its native coin listed (one carried over from round
// one) that would list the token as the native coin.
func TestAdminAddAssetContractField(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	execSQL(t, h.dsn, `INSERT INTO networks (name) VALUES ('LEGACY_NET')`)
	lower := "0x5fbdb2315678afecb367f032d93f642f64180aa3"

	r := h.postAdmin("/admin/assets", map[string]any{"network": "LEGACY_NET", "asset": "USDC", "contract_address": lower, "decimals": 6})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, lower, r.body["contract"])
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM network_assets WHERE network = 'LEGACY_NET' AND asset = 'USDC' AND contract_address = $1`, lower))

	for name, fields := range map[string]map[string]any{
		"misspelt contract": {"network": "LEGACY_NET", "asset": "USDT", "contractAddress": "0x" + repeat("cd", 20), "decimals": 6},
		"both spellings":    {"network": "LEGACY_NET", "asset": "USDT", "contract": "0x" + repeat("cd", 20), "contract_address": "0x" + repeat("cd", 20), "decimals": 6},
	} {
		t.Run(name, func(t *testing.T) {
			requireRefused(t, h.postAdmin("/admin/assets", fields), http.StatusBadRequest, httpapi.CodeInvalidRequest)
		})
	}
	require.Equal(t, 0, countRows(t, h.dsn, `SELECT count(*) FROM network_assets WHERE network = 'LEGACY_NET' AND contract_address IS NULL`),
		"no token became the network's native coin")
}

// A network and asset this api adds are accepted by its next request,
// however fresh its cached registry is (the harness's clock stands still,
// so nothing but the addition could make it read the tables again).
func TestAdminAdditionsSeenAtOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.Networks = []string{"ETH_MAINNET", "DEVNET"}
	}})
	h.createUser(7)
	newt := paymentBody(map[string]string{
		"event_id": `"newt-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1.5"`,
		"asset": `"NEWT"`, "network": `"DEVNET"`,
	})
	requireRefused(t, h.postPayment(newt), http.StatusBadRequest, httpapi.CodeUnknownAsset)

	r := h.postAdmin("/admin/networks", map[string]any{"name": "DEVNET", "chain_id": 31337, "native": "ETH", "decimals": 18})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	r = h.postAdmin("/admin/assets", map[string]any{"network": "DEVNET", "asset": "NEWT", "contract": "0x" + repeat("12", 20), "decimals": 6})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)

	r = h.postPayment(newt)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = 'newt-1' AND asset = 'NEWT' AND network = 'DEVNET'`))

	// Precision is DEVNET's: six decimals.
	tooFine := paymentBody(map[string]string{
		"event_id": `"newt-2"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1.0000001"`,
		"asset": `"NEWT"`, "network": `"DEVNET"`,
	})
	requireRefused(t, h.postPayment(tooFine), http.StatusBadRequest, httpapi.CodeInvalidAmount)
}

func repeat(s string, n int) string { return strings.Repeat(s, n) }
