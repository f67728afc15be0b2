package httpapi_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// Wrong or missing admin token → 401 (JSON, with a challenge); the read
// token opens /v1 but not /admin.
func TestAdminAndReadTokens(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for name, headers := range map[string]map[string]string{
		"missing":        nil,
		"empty bearer":   {"Authorization": "Bearer "},
		"wrong":          bearer("admin-token-0123456789-abcdefghijklmX"),
		"prefix":         bearer(adminToken[:len(adminToken)-1]),
		"longer":         bearer(adminToken + "x"),
		"api token":      bearer(apiToken),
		"basic":          {"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+adminToken))},
		"token as is":    {"Authorization": adminToken},
		"other scheme":   {"Authorization": "Token " + adminToken},
		"webhook secret": bearer(webhookSecret),
	} {
		r := h.do(http.MethodPut, "/admin/users/1", nil, headers)
		requireError(t, r, http.StatusUnauthorized)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer", name)
		requireError(t, h.do(http.MethodPost, "/admin/deposit-addresses", []byte(`{}`), headers), http.StatusUnauthorized)
	}
	require.Equal(t, 0, countRows(t, h.dsn, "SELECT count(*) FROM users"))

	require.Equal(t, http.StatusCreated, h.do(http.MethodPut, "/admin/users/1", nil, bearer(adminToken)).status)
	require.Equal(t, http.StatusCreated, h.do(http.MethodPut, "/admin/users/2", nil, map[string]string{"Authorization": "bearer " + adminToken}).status, "the scheme is case-insensitive")

	for _, token := range []string{apiToken, adminToken} {
		require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/v1/users/1/balances", nil, bearer(token)).status)
	}
	for _, headers := range []map[string]string{nil, bearer("nope"), bearer(webhookSecret)} {
		requireError(t, h.do(http.MethodGet, "/v1/users/1/balances", nil, headers), http.StatusUnauthorized)
		requireError(t, h.do(http.MethodGet, "/v1/events/x", nil, headers), http.StatusUnauthorized)
	}
	require.Equal(t, 26.0, counter(t, h.metrics, "settle_api_auth_failures_total", nil))
}

func TestAdminPutUser(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	admin := bearer(adminToken)
	r := h.do(http.MethodPut, "/admin/users/42", nil, admin)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, "created", r.body["status"])
	require.Equal(t, 42.0, r.body["user_id"])
	r = h.do(http.MethodPut, "/admin/users/42", []byte(" {} "), admin)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "exists", r.body["status"])

	for _, path := range []string{"/admin/users/0", "/admin/users/-1", "/admin/users/abc", "/admin/users/1.5", "/admin/users/99999999999999999999"} {
		requireError(t, h.do(http.MethodPut, path, nil, admin), http.StatusBadRequest)
	}
	for _, body := range []string{`{"name":"x"}`, `[]`, `null`, `{`} {
		requireError(t, h.do(http.MethodPut, "/admin/users/43", []byte(body), admin), http.StatusBadRequest)
	}
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM users"))
}

func TestAdminDepositAddresses(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	h.createUser(8)
	mixed := "0xBE3F4B43db5eb49d1f48f53443b9abce45DA3B79"
	lower := "0xbe3f4b43db5eb49d1f48f53443b9abce45da3b79"

	r := h.addAddress(7, "ETH_MAINNET", mixed)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	require.Equal(t, lower, r.body["address"], "stored lowercase")
	require.Equal(t, "registered", r.body["status"])
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM deposit_addresses WHERE address = $1 AND user_id = 7", lower))

	r = h.addAddress(7, "ETH_MAINNET", lower)
	require.Equal(t, http.StatusOK, r.status, "already registered to that user")
	require.Equal(t, "exists", r.body["status"])
	requireError(t, h.addAddress(8, "ETH_MAINNET", mixed), http.StatusConflict)
	// One key on every EVM network: another user cannot take it on
	// another network either; its own user can.
	requireCode(t, h.addAddress(8, "BASE_MAINNET", mixed), http.StatusConflict, "conflict")
	require.Equal(t, http.StatusCreated, h.addAddress(7, "BASE_MAINNET", mixed).status)

	for name, body := range map[string]string{
		"short address":    `{"address":"0x1234","network":"ETH_MAINNET","user_id":7}`,
		"no 0x":            `{"address":"be3f4b43db5eb49d1f48f53443b9abce45da3b7900","network":"ETH_MAINNET","user_id":7}`,
		"not hex":          `{"address":"0xze3f4b43db5eb49d1f48f53443b9abce45da3b79","network":"ETH_MAINNET","user_id":7}`,
		"missing address":  `{"network":"ETH_MAINNET","user_id":7}`,
		"network case":     `{"address":"` + lower + `","network":"eth_mainnet","user_id":7}`,
		"unknown network":  `{"address":"` + lower + `","network":"ETH_MAINET","user_id":7}`,
		"user as a string": `{"address":"` + lower + `","network":"ETH_MAINNET","user_id":"7"}`,
		"unknown user":     `{"address":"0x1111111111111111111111111111111111111111","network":"ETH_MAINNET","user_id":9}`,
		"malformed":        `{"address":`,
	} {
		t.Run(name, func(t *testing.T) {
			requireError(t, h.do(http.MethodPost, "/admin/deposit-addresses", []byte(body), bearer(adminToken)), http.StatusBadRequest)
		})
	}
	require.Equal(t, 2, countRows(t, h.dsn, "SELECT count(*) FROM deposit_addresses")) // the address on ETH_MAINNET and BASE_MAINNET
}

func TestReads(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	read := bearer(apiToken)
	h.createUser(7)

	r := h.do(http.MethodGet, "/v1/users/7/balances", nil, read)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, map[string]any{"user_id": 7.0, "balances": []any{}}, r.body)

	execSQL(t, h.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'ETH', 150, 150), (7, 'USDC', 0.5, 0.5)`)
	r = h.do(http.MethodGet, "/v1/users/7/balances", nil, read)
	require.Equal(t, []any{
		map[string]any{"asset": "ETH", "balance": "150", "held": "0", "available": "150"},
		map[string]any{"asset": "USDC", "balance": "0.5", "held": "0", "available": "0.5"},
	}, r.body["balances"], "amounts are decimal strings")
	requireError(t, h.do(http.MethodGet, "/v1/users/8/balances", nil, read), http.StatusNotFound)
	requireError(t, h.do(http.MethodGet, "/v1/users/x/balances", nil, read), http.StatusBadRequest)

	require.Equal(t, http.StatusOK, h.postPayment(deposit("read-1", 7, "2.50"), "X-Request-ID", "trace-read-1").status)
	r = h.do(http.MethodGet, "/v1/events/read-1", nil, read)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "read-1", r.body["event_id"])
	require.Equal(t, "deposit", r.body["event_type"])
	require.Equal(t, "2.5", r.body["amount"])
	require.Equal(t, "pending", r.body["status"])
	require.Equal(t, 0.0, r.body["retry_count"])
	require.Equal(t, "trace-read-1", r.body["trace_id"])
	require.NotEmpty(t, r.body["created_at"])
	require.NotEmpty(t, r.body["updated_at"])
	require.NotContains(t, r.body, "finality")
	require.NotContains(t, r.body, "outcome", "a live event has no outcome")

	// A deposit waiting for finality shows it is waiting, and until when.
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'enqueued' WHERE event_id = 'read-1'`)
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'awaiting_finality', next_check_at = '2030-01-01T00:00:30Z', check_count = 3 WHERE event_id = 'read-1'`)
	r = h.do(http.MethodGet, "/v1/events/read-1", nil, read)
	require.Equal(t, "awaiting_finality", r.body["status"])
	require.Equal(t, map[string]any{"state": "awaiting_finality", "next_check_at": "2030-01-01T00:00:30Z", "check_count": 3.0}, r.body["finality"])

	// Ids with a slash or a colon are reachable, percent-encoded.
	require.Equal(t, http.StatusOK, h.postPayment(deposit("a/b:c", 7, "1")).status)
	r = h.do(http.MethodGet, "/v1/events/"+url.PathEscape("a/b:c"), nil, read)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "a/b:c", r.body["event_id"])

	requireError(t, h.do(http.MethodGet, "/v1/events/nope", nil, read), http.StatusNotFound)
	requireError(t, h.do(http.MethodGet, "/v1/events/a%00b", nil, read), http.StatusNotFound)
	requireError(t, h.do(http.MethodGet, "/v1/events/%FF", nil, read), http.StatusNotFound)
}
