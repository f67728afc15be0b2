package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
)

// The Error schema's enum and the Go map of error kinds list the same
// codes, so a client generated from the spec knows every code it can get.
func TestErrorCodesMatchOpenAPI(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas struct {
				Error struct {
					Required   []string `yaml:"required"`
					Properties struct {
						Code struct {
							Enum []string `yaml:"enum"`
						} `yaml:"code"`
					} `yaml:"properties"`
				} `yaml:"Error"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(httpapi.OpenAPISpec(), &doc))
	spec := append([]string(nil), doc.Components.Schemas.Error.Properties.Code.Enum...)
	codes := httpapi.Codes()
	sort.Strings(spec)
	sort.Strings(codes)
	require.Equal(t, codes, spec)
	require.Contains(t, doc.Components.Schemas.Error.Required, "code")
	for _, want := range []string{"invalid_signature", "unauthorized", "invalid_amount", "unknown_user", "unknown_asset",
		"invalid_request", "not_found", "method_not_allowed", "conflict", "body_too_large", "rate_limited", "unavailable", "internal"} {
		require.Contains(t, codes, want, "CONTRACT.md names it")
	}
}

// Every refusal the real server gives carries its code.
func TestErrorBodiesCarryCodes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	post := func(body []byte, headers map[string]string) response {
		return h.do(http.MethodPost, "/webhook/payments", body, headers)
	}

	body := deposit("codes-1", 7, "1")
	requireCode(t, post(body, nil), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	requireCode(t, post(body, map[string]string{httpapi.HeaderSignature: sign(append(body, ' '))}), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	r := h.do(http.MethodGet, "/v1/users/7/balances", nil, nil)
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	requireCode(t, h.do(http.MethodGet, "/v1/users/7/balances", nil, bearer("x"+apiToken)), http.StatusUnauthorized, httpapi.CodeUnauthorized)
	requireCode(t, h.do(http.MethodPut, "/admin/users/8", nil, bearer(apiToken)), http.StatusUnauthorized, httpapi.CodeUnauthorized)

	for _, amount := range []string{"abc", "-1", "0", "1.2.3", "", "0.0000000000000000001", "100000000000000000000"} {
		requireCode(t, h.postPayment(deposit("codes-amount-"+amount, 7, amount)), http.StatusBadRequest, httpapi.CodeInvalidAmount)
	}
	requireCode(t, h.postPayment(deposit("codes-user", 999, "1")), http.StatusBadRequest, httpapi.CodeUnknownUser)
	requireCode(t, h.postPayment(paymentBody(map[string]string{
		"event_id": `"codes-asset"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "asset": `"DOGE"`,
	})), http.StatusBadRequest, httpapi.CodeUnknownAsset)
	for _, bad := range [][]byte{[]byte("{"), []byte(`{"event_id":"x"}`), paymentBody(map[string]string{
		"event_id": `"codes-type"`, "event_type": `"gift"`, "user_id": "7", "amount": `"1"`,
	})} {
		requireCode(t, h.postPayment(bad), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	}
	requireCode(t, h.do(http.MethodGet, "/v1/users/x/balances", nil, bearer(apiToken)), http.StatusBadRequest, httpapi.CodeInvalidRequest)

	requireCode(t, h.do(http.MethodGet, "/nope", nil, nil), http.StatusNotFound, httpapi.CodeNotFound)
	requireCode(t, h.do(http.MethodGet, "/v1/events/never", nil, bearer(apiToken)), http.StatusNotFound, httpapi.CodeNotFound)
	// A read of an unknown user is a 404 with the contract's code for an
	// unknown user, not the unknown route's.
	requireCode(t, h.do(http.MethodGet, "/v1/users/999/balances", nil, bearer(apiToken)), http.StatusNotFound, httpapi.CodeUnknownUser)
	requireCode(t, h.do(http.MethodGet, "/v1/users/999/journal", nil, bearer(apiToken)), http.StatusNotFound, httpapi.CodeUnknownUser)
	requireCode(t, h.do(http.MethodGet, "/webhook/payments", nil, nil), http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)

	require.Equal(t, http.StatusOK, h.postPayment(body).status)
	requireCode(t, h.postPayment(deposit("codes-1", 7, "2")), http.StatusConflict, httpapi.CodeConflict)

	big := bytes.Repeat([]byte(" "), httpapi.PaymentsBodyMax+1)
	requireCode(t, h.postPayment(big), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)
	requireCode(t, h.do(http.MethodPut, "/admin/users/9", big, bearer(adminToken)), http.StatusRequestEntityTooLarge, httpapi.CodeBodyTooLarge)

	// The metric's reasons follow the codes, not the texts.
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"outcome": "rejected", "reason": "unknown_user"}))
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"outcome": "rejected", "reason": "unknown_asset"}))
}

// 429: a client over WEBHOOK_RATE_LIMIT gets rate_limited with
// Retry-After.
func TestRateLimitedCode(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.RateLimit = mustRateLimit(t, "1/m")
	}})
	body := deposit("limited-1", 7, "1")
	unsigned := map[string]string{"Content-Type": "application/json"}
	requireCode(t, h.do(http.MethodPost, "/webhook/payments", body, unsigned), http.StatusUnauthorized, httpapi.CodeInvalidSignature)
	r := h.do(http.MethodPost, "/webhook/payments", body, unsigned)
	requireCode(t, r, http.StatusTooManyRequests, httpapi.CodeRateLimited)
	require.NotEmpty(t, r.header.Get("Retry-After"))
}

// 503: with PostgreSQL stopped, writes and reads answer unavailable with
// Retry-After, and so does /readyz. The admin writes too: their own
// transactions' BEGIN fails, not a statement inside.
func TestUnavailableCode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own PostgreSQL server")
	}
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(pg.Close)
	dsn := pg.URL("postgres")
	migrator, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 2})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx)
	require.NoError(t, err)
	migrator.Close()

	h := newHarness(t, harnessOptions{dsn: dsn})
	h.createUser(7)
	// The registry cached, so the admin writes reach their transactions.
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", "0x2222222222222222222222222222222222222222").status)
	pg.Stop()
	for _, r := range []response{
		h.addAddress(7, "ETH_MAINNET", "0x3333333333333333333333333333333333333333"),
		h.postAdmin("/admin/networks", map[string]any{"name": "DEVNET", "chain_id": 31337, "native": "DEV", "decimals": 18}),
		h.postAdmin("/admin/assets", map[string]any{"network": "ETH_MAINNET", "asset": "DUSD", "contract": "0x1111111111111111111111111111111111111111", "decimals": 6}),
		h.postPayment(deposit("down-1", 7, "1")),
		h.do(http.MethodGet, "/v1/events/down-1", nil, bearer(apiToken)),
		h.do(http.MethodGet, "/v1/users/7/balances", nil, bearer(apiToken)),
		h.do(http.MethodPut, "/admin/users/8", nil, bearer(adminToken)),
		h.do(http.MethodGet, "/readyz", nil, nil),
	} {
		requireCode(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
		if r.body["checks"] == nil {
			require.NotEmpty(t, r.header.Get("Retry-After"), "body %s", r.raw)
		}
	}
}
