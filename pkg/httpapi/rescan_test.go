package httpapi_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRescanRequests: POST /admin/rescan answers 202 with a job for a
// valid range and 400 invalid_request, storing nothing, for every other
// body; GET /admin/rescan/{id} shows the job; the admin token is needed.
func TestRescanRequests(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	admin := bearer(adminToken)
	for name, body := range map[string]string{
		"inverted":          `{"network":"ETH_MAINNET","from_block":10,"to_block":9}`,
		"negative from":     `{"network":"ETH_MAINNET","from_block":-1,"to_block":9}`,
		"negative to":       `{"network":"ETH_MAINNET","from_block":0,"to_block":-9}`,
		"over the maximum":  `{"network":"ETH_MAINNET","from_block":0,"to_block":100000}`,
		"far over":          `{"network":"ETH_MAINNET","from_block":0,"to_block":4611686018427387904}`,
		"past bigint":       `{"network":"ETH_MAINNET","from_block":0,"to_block":99999999999999999999}`,
		"a float":           `{"network":"ETH_MAINNET","from_block":1.0,"to_block":2}`,
		"an exponent":       `{"network":"ETH_MAINNET","from_block":1,"to_block":1e3}`,
		"a string":          `{"network":"ETH_MAINNET","from_block":"1","to_block":2}`,
		"leading zero":      `{"network":"ETH_MAINNET","from_block":01,"to_block":2}`,
		"no network":        `{"from_block":1,"to_block":2}`,
		"unknown network":   `{"network":"ETH_MAINET","from_block":1,"to_block":2}`,
		"disabled network":  `{"network":"BASE_MAINNET","from_block":1,"to_block":2}`,
		"malformed network": `{"network":"eth","from_block":1,"to_block":2}`,
		"missing to":        `{"network":"ETH_MAINNET","from_block":1}`,
		"unknown field":     `{"network":"ETH_MAINNET","from_block":1,"to_block":2,"address":"0x1111111111111111111111111111111111111111"}`,
		"not an object":     `[1,2]`,
		"duplicate field":   `{"network":"ETH_MAINNET","from_block":1,"from_block":2,"to_block":3}`,
		"trailing data":     `{"network":"ETH_MAINNET","from_block":1,"to_block":2} x`,
		"operator a number": `{"network":"ETH_MAINNET","from_block":1,"to_block":2,"operator":7}`,
		"operator too long": `{"network":"ETH_MAINNET","from_block":1,"to_block":2,"operator":"` + strings.Repeat("a", 201) + `"}`,
		"operator control":  `{"network":"ETH_MAINNET","from_block":1,"to_block":2,"operator":"a\nb"}`,
	} {
		r := h.do(http.MethodPost, "/admin/rescan", []byte(body), admin)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", name, r.raw)
		require.Equal(t, "invalid_request", r.body["code"], name)
	}
	require.Equal(t, 0, countRows(t, h.dsn, "SELECT count(*) FROM rescan_jobs"))
	requireError(t, h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":1,"to_block":2}`), nil), http.StatusUnauthorized)

	r := h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":0,"to_block":99999}`), admin)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	require.Equal(t, "running", r.body["status"])
	require.EqualValues(t, 100000, r.body["blocks_total"], "exactly RESCAN_BLOCKS_MAX blocks")
	require.EqualValues(t, 0, r.body["blocks_done"])
	id, ok := r.body["id"].(string)
	require.True(t, ok)

	got := h.do(http.MethodGet, "/admin/rescan/"+id, nil, admin)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, id, got.body["id"])
	require.EqualValues(t, 99999, got.body["to_block"])
	require.Equal(t, "admin", got.body["requested_by"])
	require.Regexp(t, `^admin-api @`, got.body["operator"], "who asked is stored with the job")
	require.NotContains(t, got.body, "waiting_head")
	// Once the scanner found its range above the finality head, it says so.
	execSQL(t, h.dsn, "UPDATE rescan_jobs SET waiting_head = 7 WHERE id = $1", id)
	got = h.do(http.MethodGet, "/admin/rescan/"+id, nil, admin)
	require.EqualValues(t, 7, got.body["waiting_head"])
	// A job that restarted says how often, when and why.
	require.EqualValues(t, 0, got.body["restarts"])
	require.NotContains(t, got.body, "last_restart_at")
	require.NotContains(t, got.body, "last_restart_reason")
	execSQL(t, h.dsn, `UPDATE rescan_jobs SET restarts = 2, last_restart_at = '2026-01-02T03:04:05Z',
		last_restart_reason = 'the branch changed under the job; reading again from block 0' WHERE id = $1`, id)
	got = h.do(http.MethodGet, "/admin/rescan/"+id, nil, admin)
	require.EqualValues(t, 2, got.body["restarts"])
	require.Equal(t, "2026-01-02T03:04:05Z", got.body["last_restart_at"])
	require.Equal(t, "the branch changed under the job; reading again from block 0", got.body["last_restart_reason"])
	requireError(t, h.do(http.MethodGet, "/admin/rescan/nope", nil, admin), http.StatusNotFound)
	requireError(t, h.do(http.MethodGet, "/admin/rescan/"+id, nil, nil), http.StatusUnauthorized)
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM rescan_jobs"))

	// A named operator, and why, as a recheck takes it.
	r = h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":5,"to_block":6,"operator":"ana: provider outage"}`), admin)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	require.Regexp(t, `^ana: provider outage @`, r.body["operator"])
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM rescan_jobs WHERE operator LIKE 'ana: provider outage @%'"))
}

// TestDepositAddressFromBlock: from_block on a registration schedules a
// backfill of that address; a malformed one is a 400 that registers
// nothing.
func TestDepositAddressFromBlock(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	admin := bearer(adminToken)
	h.createUser(1)
	const addr = "0x1111111111111111111111111111111111111111"
	for _, bad := range []string{`-1`, `1.5`, `"7"`, `1e2`} {
		body := fmt.Sprintf(`{"address":%q,"network":"ETH_MAINNET","user_id":1,"from_block":%s}`, addr, bad)
		requireError(t, h.do(http.MethodPost, "/admin/deposit-addresses", []byte(body), admin), http.StatusBadRequest)
	}
	require.Equal(t, 0, countRows(t, h.dsn, "SELECT count(*) FROM deposit_addresses"))

	body := fmt.Sprintf(`{"address":%q,"network":"ETH_MAINNET","user_id":1,"from_block":7}`, addr)
	r := h.do(http.MethodPost, "/admin/deposit-addresses", []byte(body), admin)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	id, ok := r.body["backfill"].(string)
	require.True(t, ok, "%s", r.raw)
	got := h.do(http.MethodGet, "/admin/rescan/"+id, nil, admin)
	require.Equal(t, http.StatusOK, got.status, "%s", got.raw)
	require.Equal(t, addr, got.body["address"])
	require.EqualValues(t, 7, got.body["from_block"])
	require.Nil(t, got.body["to_block"], "its end waits for the scanner")
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM deposit_addresses WHERE from_block = 7"))

	r = h.do(http.MethodPost, "/admin/deposit-addresses", []byte(fmt.Sprintf(`{"address":%q,"network":"ETH_MAINNET","user_id":1}`, addr)), admin)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Nil(t, r.body["backfill"], "no from_block, no backfill")
}

// TestRescanCancel: POST /admin/rescan/{id}/cancel ends a running job
// (failed, its error naming who, from where, and why) and answers it;
// without a reason it is a 400 that changes nothing (the operator is
// optional, admin-api by default, as for the other admin actions), an
// unknown job a 404, a job that ended a 409, and it needs the admin
// token.
func TestRescanCancel(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	admin := bearer(adminToken)
	r := h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":30000000,"to_block":30000100}`), admin)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	id, ok := r.body["id"].(string)
	require.True(t, ok)
	cancelPath := "/admin/rescan/" + id + "/cancel"

	for name, body := range map[string]string{
		"empty":             ``,
		"no reason":         `{"operator":"bob"}`,
		"blank reason":      `{"operator":"bob","reason":" "}`,
		"reason a number":   `{"operator":"bob","reason":7}`,
		"operator too long": `{"operator":"` + strings.Repeat("a", 201) + `","reason":"typo"}`,
		"reason too long":   `{"operator":"bob","reason":"` + strings.Repeat("a", 1001) + `"}`,
		"operator control":  `{"operator":"a\nb","reason":"typo"}`,
		"unknown field":     `{"operator":"bob","reason":"typo","force":true}`,
		"not an object":     `["bob","typo"]`,
	} {
		r := h.do(http.MethodPost, cancelPath, []byte(body), admin)
		requireError(t, r, http.StatusBadRequest)
		require.Equal(t, "invalid_request", r.body["code"], name)
	}
	requireError(t, h.do(http.MethodPost, cancelPath, []byte(`{"operator":"bob","reason":"typo"}`), nil), http.StatusUnauthorized)
	requireError(t, h.do(http.MethodPost, cancelPath, []byte(`{"operator":"bob","reason":"typo"}`), bearer(apiToken)), http.StatusUnauthorized)
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM rescan_jobs WHERE status = 'running' AND error IS NULL"), "refusals change nothing")

	r = h.do(http.MethodPost, cancelPath, []byte(`{"operator":"bob","reason":"typo: block 3,000,000 meant"}`), admin)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, id, r.body["id"])
	require.Equal(t, "failed", r.body["status"])
	require.Regexp(t, `^cancelled by bob @\S+: typo: block 3,000,000 meant$`, r.body["error"])
	got := h.do(http.MethodGet, "/admin/rescan/"+id, nil, admin)
	require.Equal(t, "failed", got.body["status"])
	require.Equal(t, r.body["error"], got.body["error"], "the record is the job's own")

	r = h.do(http.MethodPost, cancelPath, []byte(`{"operator":"bob","reason":"again"}`), admin)
	requireError(t, r, http.StatusConflict)
	require.Equal(t, "conflict", r.body["code"])
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM rescan_jobs WHERE error LIKE '%typo: block 3,000,000 meant'"), "a second cancel changes nothing")
	requireError(t, h.do(http.MethodPost, "/admin/rescan/rescan_nope/cancel", []byte(`{"operator":"bob","reason":"typo"}`), admin), http.StatusNotFound)

	r = h.do(http.MethodPost, "/admin/rescan", []byte(`{"network":"ETH_MAINNET","from_block":30000000,"to_block":30000100}`), admin)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	r = h.do(http.MethodPost, "/admin/rescan/"+r.body["id"].(string)+"/cancel", []byte(`{"operator":" ","reason":"not needed"}`), admin)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Regexp(t, `^cancelled by admin-api @\S+: not needed$`, r.body["error"], "no operator named: admin-api, as for the other actions")
}
