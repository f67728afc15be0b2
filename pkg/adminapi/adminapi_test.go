package adminapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	adminToken = "admin-token-0123456789abcdefghijklmnop"
	apiToken   = "api-token-0123456789abcdefghijklmnopqrs"
)

type env struct {
	t   *testing.T
	db  *postgres.DB
	url string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store: db, Redis: rdb, Log: zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789abcdefghijkl", APIToken: apiToken, AdminToken: adminToken,
		AdminRoutes: adminapi.Routes(db),
		AdminMounts: []httpapi.Mount{adminapi.Dashboard(rdb, true)},
	})
	require.NoError(t, err)
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)
	return &env{t: t, db: db, url: ts.URL}
}

func (e *env) do(method, path, token, body string) (int, map[string]any) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out
}

// deadLettered makes a deposit fail into the DLQ, as exhausted retries do.
func (e *env) deadLettered(id string) int64 {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.db.CreateUser(ctx, 1)
	require.NoError(e.t, err)
	_, err = e.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("3")}})
	require.NoError(e.t, err)
	claimed, err := e.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(e.t, err)
	c := claimed[0].Event
	moved, dlq, err := e.db.FailToDLQ(ctx, payment.DeadLetter{EventID: c.ID, EventType: string(c.Type), UserID: 1, Asset: "ETH", Amount: "3",
		Error: "retries exhausted", Attempt: 6, Generation: c.Generation, Source: payment.SourceWorker})
	require.NoError(e.t, err)
	require.True(e.t, moved)
	return dlq
}

func (e *env) settle() {
	e.t.Helper()
	ctx := context.Background()
	claimed, err := e.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(e.t, err)
	for _, c := range claimed {
		_, err := e.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{})
		require.NoError(e.t, err)
	}
}

func TestReplayTwiceCreditsOnce(t *testing.T) {
	e := newEnv(t)
	id := e.deadLettered("d-1")
	status, body := e.do(http.MethodGet, "/admin/dlq", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	entries := body["entries"].([]any)
	require.Len(t, entries, 1)
	require.Equal(t, "d-1", entries[0].(map[string]any)["event_id"])
	require.Equal(t, "3", entries[0].(map[string]any)["amount"])

	path := "/admin/dlq/" + jsonInt(id) + "/replay"
	status, body = e.do(http.MethodPost, path, adminToken, `{"reason":"node was down","operator":"alice"}`)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "reopened", body["result"])
	status, body = e.do(http.MethodPost, path, adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "already_replayed", body["result"])
	e.settle()
	e.settle()
	balances, err := e.db.Balances(context.Background(), 1)
	require.NoError(t, err)
	require.Len(t, balances, 1)
	require.True(t, balances[0].Balance.Equal(decimal.RequireFromString("3")), "credited once")

	status, body = e.do(http.MethodGet, "/admin/dlq/"+jsonInt(id), adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "replayed", body["resolution"])
	require.Contains(t, body["resolved_by"], "alice @")
	require.Equal(t, "node was down", body["resolution_reason"])
	require.Equal(t, "confirmed", body["event_status"])
}

func TestDiscardedEntryCannotBeReplayed(t *testing.T) {
	e := newEnv(t)
	id := e.deadLettered("d-2")
	path := "/admin/dlq/" + jsonInt(id)
	status, _ := e.do(http.MethodPost, path+"/discard", adminToken, `{}`)
	require.Equal(t, http.StatusBadRequest, status, "a reason is required")
	status, body := e.do(http.MethodPost, path+"/discard", adminToken, `{"reason":"refunded by hand"}`)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "discarded", body["result"])
	status, body = e.do(http.MethodPost, path+"/discard", adminToken, `{"reason":"again"}`)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "already_discarded", body["result"])
	status, body = e.do(http.MethodPost, path+"/replay", adminToken, `{}`)
	require.Equal(t, http.StatusConflict, status)
	require.NotEmpty(t, body["trace_id"])
	status, _ = e.do(http.MethodGet, "/admin/dlq?state=resolved", adminToken, "")
	require.Equal(t, http.StatusOK, status)
}

func TestDLQRoutesNeedTheAdminToken(t *testing.T) {
	e := newEnv(t)
	for _, token := range []string{"", apiToken, "wrong"} {
		status, body := e.do(http.MethodGet, "/admin/dlq", token, "")
		require.Equal(t, http.StatusUnauthorized, status, token)
		require.NotEmpty(t, body["error"])
	}
	status, _ := e.do(http.MethodPost, "/admin/dlq/abc/replay", adminToken, "")
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = e.do(http.MethodPost, "/admin/dlq/999/replay", adminToken, "")
	require.Equal(t, http.StatusNotFound, status)
	status, _ = e.do(http.MethodGet, "/admin/dlq?state=weird", adminToken, "")
	require.Equal(t, http.StatusBadRequest, status)
}

func TestDashboardBehindTheAdminToken(t *testing.T) {
	e := newEnv(t)
	resp, err := http.Get(e.url + "/admin/queues/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	req, _ := http.NewRequest(http.MethodGet, e.url+"/admin/queues/", nil)
	req.SetBasicAuth("operator", adminToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, strings.ToLower(string(page)), "<html")

	req, _ = http.NewRequest(http.MethodGet, e.url+"/admin/queues/api/queues", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the dashboard's JSON API answers through the mount")
}

// TestDashboardErrorsAreJSON: asynqmon answers its errors in plain text
// (and an unknown queue as a 500); through the mount each is the API's
// JSON error with a code and trace id, and the status it means.
func TestDashboardErrorsAreJSON(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodDelete, "/admin/queues/api/queues/default", http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed}, // read-only
		{http.MethodGet, "/admin/queues/api/queues/no-such-queue", http.StatusNotFound, httpapi.CodeNotFound},
	} {
		req, err := http.NewRequest(c.method, e.url+c.path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s %s: %s", c.method, c.path, raw)
		require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"),
			"%s %s answered %d %q with Content-Type %q", c.method, c.path, resp.StatusCode, raw, resp.Header.Get("Content-Type"))
		var body map[string]any
		require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
		require.Equal(t, c.code, body["code"])
		require.NotEmpty(t, body["error"])
		require.NotEmpty(t, body["trace_id"])
	}
}

// TestDashboardActionsRefuseCrossSiteRequests: the mount takes HTTP Basic,
// which a browser resends by itself from any page once the operator logged
// in, and asynqmon acts on a POST with no token of its own. With the
// dashboard writable, a request the browser marks as from another site is
// a 403 in the API's error shape and changes nothing; the dashboard's own
// pages (same origin) and clients that are not browsers still act.
func TestDashboardActionsRefuseCrossSiteRequests(t *testing.T) {
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store: db, Redis: rdb, Log: zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789abcdefghijkl", APIToken: apiToken, AdminToken: adminToken,
		AdminMounts: []httpapi.Mount{adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: false})},
	})
	require.NoError(t, err)
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)
	host := strings.TrimPrefix(ts.URL, "http://")

	_, err = asynq.NewClientFromRedisClient(rdb).EnqueueContext(context.Background(), asynq.NewTask("payment", nil), asynq.Queue("critical"))
	require.NoError(t, err)
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	paused := func() bool {
		info, err := inspector.GetQueueInfo("critical")
		require.NoError(t, err)
		return info.Paused
	}
	pause := func(method, path string, headers map[string]string) (int, map[string]any) {
		req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(""))
		require.NoError(t, err)
		req.SetBasicAuth("operator", adminToken)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}

	for _, headers := range []map[string]string{
		// What <form method=post action=".../critical:pause"> on another
		// site makes the operator's browser send.
		{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
		{"Origin": "https://evil.example"},
		{"Origin": "null"},
		{"Origin": "http://" + host + ".evil.example"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		for _, method := range []string{http.MethodPost, http.MethodDelete} {
			path := "/admin/queues/api/queues/critical:pause"
			if method == http.MethodDelete {
				path = "/admin/queues/api/queues/critical"
			}
			status, body := pause(method, path, headers)
			require.Equal(t, http.StatusForbidden, status, "%s %v", method, headers)
			require.Equal(t, httpapi.CodeForbidden, body["code"], "%v", body)
			require.NotEmpty(t, body["trace_id"])
			require.False(t, paused(), "a cross-site %s %v acted", method, headers)
		}
	}

	status, body := pause(http.MethodPost, "/admin/queues/api/queues/critical:pause", map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"})
	require.Less(t, status, 300, "the dashboard's own page: %v", body)
	require.True(t, paused())
	status, body = pause(http.MethodPost, "/admin/queues/api/queues/critical:resume", nil)
	require.Less(t, status, 300, "a client that is not a browser: %v", body)
	require.False(t, paused())
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestDashboardSecurityHeaders: every answer of the dashboard forbids
// framing (framed, its own buttons send same-origin requests that the
// cross-site check lets through), sniffing and caching, and its page runs
// no inline script but the two it serves, by hash.
func TestDashboardSecurityHeaders(t *testing.T) {
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store: db, Redis: rdb, Log: zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789abcdefghijkl", APIToken: apiToken, AdminToken: adminToken,
		AdminMounts: []httpapi.Mount{adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: false, PrometheusURL: "http://prometheus:9090"})},
	})
	require.NoError(t, err)
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)

	get := func(method, path string, header map[string]string) (int, http.Header, string) {
		req, err := http.NewRequest(method, ts.URL+path, nil)
		require.NoError(t, err)
		req.SetBasicAuth("operator", adminToken)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}

	status, header, body := get(http.MethodGet, "/admin/queues/", nil)
	require.Equal(t, http.StatusOK, status)
	policy := header.Get("Content-Security-Policy")
	directives := map[string]string{}
	for _, d := range strings.Split(policy, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		directives[name] = value
	}
	require.Equal(t, "'none'", directives["frame-ancestors"], "no other page may frame the dashboard: %q", policy)
	require.NotContains(t, directives["script-src"], "unsafe", policy)
	scripts := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindAllStringSubmatch(body, -1)
	require.Len(t, scripts, 2, "asynqmon's page has two inline scripts: %s", body)
	for _, s := range scripts {
		sum := sha256.Sum256([]byte(s[1]))
		require.Contains(t, directives["script-src"], "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'", "the page's inline script %.60q runs", s[1])
	}
	asset := regexp.MustCompile(`<script src="(/admin/queues/static/js/[^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, asset, "the page loads its scripts from the mount")

	for _, c := range []struct {
		method, path string
		header       map[string]string
		status       int
		noStore      bool
	}{
		{http.MethodGet, "/admin/queues/", nil, http.StatusOK, true},
		{http.MethodGet, "/admin/queues/queues/default", nil, http.StatusOK, true}, // the page again (the app routes itself)
		{http.MethodGet, "/admin/queues/api/queues", nil, http.StatusOK, true},
		{http.MethodGet, "/admin/queues/api/queues/no-such-queue", nil, http.StatusNotFound, true},
		{http.MethodPost, "/admin/queues/api/queues/default:pause", map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden, true},
		{http.MethodGet, asset[1], nil, http.StatusOK, false},
	} {
		status, header, body := get(c.method, c.path, c.header)
		name := c.method + " " + c.path
		require.Equal(t, c.status, status, "%s: %s", name, body)
		require.Equal(t, "DENY", header.Get("X-Frame-Options"), name)
		require.Equal(t, policy, header.Get("Content-Security-Policy"), name)
		require.Equal(t, []string{"nosniff"}, header.Values("X-Content-Type-Options"), name)
		require.Equal(t, "same-origin", header.Get("Referrer-Policy"), name)
		if c.noStore {
			require.Equal(t, "no-store", header.Get("Cache-Control"), name)
		}
	}
}

// A reason and an operator are bounded in characters, as the console and
// settlectl count them: 1,000 two-byte characters fit, 1,001 do not.
func TestDiscardReasonCountsCharacters(t *testing.T) {
	e := newEnv(t)
	id := e.deadLettered("d-chars")
	path := "/admin/dlq/" + jsonInt(id) + "/discard"
	status, body := e.do(http.MethodPost, path, adminToken, `{"reason":"`+strings.Repeat("é", 1001)+`"}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", body)
	status, body = e.do(http.MethodPost, path, adminToken, `{"reason":"x","operator":"`+strings.Repeat("ж", 201)+`"}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", body)
	status, body = e.do(http.MethodPost, path, adminToken, `{"reason":"`+strings.Repeat("é", 1000)+`","operator":"`+strings.Repeat("ж", 200)+`"}`)
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Equal(t, "discarded", body["result"])
}

// A reason may span lines, a name may not, and neither takes an escape
// sequence for the terminal of whoever lists them.
func TestDiscardRefusesControlCharacters(t *testing.T) {
	e := newEnv(t)
	for name, body := range map[string]string{
		"escape in reason":   `{"reason":"x\u001b[2J"}`,
		"newline in name":    `{"reason":"x","operator":"ann\nbob"}`,
		"escape in operator": `{"reason":"x","operator":"ann\u001b[31m"}`,
	} {
		id := e.deadLettered("d-ctl-" + strings.ReplaceAll(name, " ", "-"))
		status, answer := e.do(http.MethodPost, "/admin/dlq/"+jsonInt(id)+"/discard", adminToken, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", name, answer)
		require.Contains(t, answer["error"], "control characters", name)
	}
	id := e.deadLettered("d-ctl-lines")
	status, answer := e.do(http.MethodPost, "/admin/dlq/"+jsonInt(id)+"/discard", adminToken, `{"reason":"duplicate of d-1\r\nchecked\twith the chain","operator":"ann"}`)
	require.Equal(t, http.StatusOK, status, "%v", answer)
}

// TestDecisionBodyIsReadStrictly: a decision body is read as strictly as
// the API's own: a member twice (which copy wins depends on the reader),
// data after the object, an unknown member or bytes that are not UTF-8
// are a 400, and nothing is decided.
func TestDecisionBodyIsReadStrictly(t *testing.T) {
	e := newEnv(t)
	id := e.deadLettered("d-strict")
	path := "/admin/dlq/" + jsonInt(id) + "/discard"
	for name, body := range map[string]string{
		"a member twice":    `{"reason":"refunded","reason":"x"}`,
		"twice by case":     `{"reason":"refunded","REASON":"x"}`,
		"data after":        `{"reason":"refunded"} {"reason":"x"}`,
		"an unknown member": `{"reason":"refunded","why":"x"}`,
		"not UTF-8":         "{\"reason\":\"refunded \xff\"}",
		"not an object":     `["reason"]`,
	} {
		status, answer := e.do(http.MethodPost, path, adminToken, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", name, answer)
	}
	status, answer := e.do(http.MethodPost, path, adminToken, `{"reason":"refunded"}`)
	require.Equal(t, http.StatusOK, status, "%v", answer)
	require.Equal(t, "discarded", answer["result"])
}
