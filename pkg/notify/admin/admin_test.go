package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/notify/admin"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const adminToken = "admin-token-0123456789abcdefghijklmnop"

func serve(t *testing.T) (*postgres.DB, string) {
	t.Helper()
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store: db, Redis: rdb, Log: zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789abcdefghijkl", APIToken: "api-token-0123456789abcdefghijklmnopqrs", AdminToken: adminToken,
		AdminRoutes: admin.Routes(db),
	})
	require.NoError(t, err)
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)
	return db, ts.URL
}

func call(t *testing.T, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// notifications writes n notifications through the ledger (withdrawals
// that cannot be covered notify insufficient_funds).
func notifications(t *testing.T, db *postgres.DB, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.Zero))
	for i := range n {
		_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: fmt.Sprintf("w%d", i), Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("5"), TraceID: "tr"}})
		require.NoError(t, err)
	}
	claimed, err := db.ClaimOutbox(ctx, n, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	var items []postgres.LedgerItem
	for _, c := range claimed {
		items = append(items, postgres.LedgerItem{Event: c.Event})
	}
	_, err = db.ApplyBatch(ctx, items, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
}

func TestListAndRedeliver(t *testing.T) {
	db, base := serve(t)
	notifications(t, db, 3)
	ctx := context.Background()

	status, body := call(t, http.MethodGet, base+"/admin/notifications", "", "")
	require.Equal(t, http.StatusUnauthorized, status, "behind the admin token")
	require.NotContains(t, body, "notifications", "nothing listed without the token")

	status, body = call(t, http.MethodGet, base+"/admin/notifications?state=pending&limit=2", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	list := body["notifications"].([]any)
	require.Len(t, list, 2)
	first, second := list[0].(map[string]any), list[1].(map[string]any)
	require.Greater(t, first["id"].(float64), second["id"].(float64), "newest first")
	require.Equal(t, second["id"], body["next_before"])
	status, all := call(t, http.MethodGet, base+"/admin/notifications?limit=1000", adminToken, "")
	require.Equal(t, http.StatusOK, status, "the bound itself is accepted")
	require.Len(t, all["notifications"].([]any), 3)
	require.Equal(t, "all", all["state"], "all by default")
	status, body = call(t, http.MethodGet, fmt.Sprintf("%s/admin/notifications?state=pending&before=%v", base, body["next_before"]), adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Len(t, body["notifications"].([]any), 1)
	require.Nil(t, body["next_before"])

	// Deliver one by hand and redeliver it through the endpoint.
	due, err := db.ClaimNotifications(ctx, 1, 0)
	require.NoError(t, err)
	require.NoError(t, db.NotificationDelivered(ctx, due[0].ID, postgres.DeliveryAttempt{At: time.Now(), HTTPStatus: 204}))
	status, body = call(t, http.MethodGet, base+"/admin/notifications?state=delivered", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	delivered := body["notifications"].([]any)[0].(map[string]any)
	require.Equal(t, float64(due[0].ID), delivered["id"])
	require.Equal(t, float64(204), delivered["deliveries"].([]any)[0].(map[string]any)["http_status"])

	path := fmt.Sprintf("/admin/notifications/%d/redeliver", due[0].ID)
	status, body = call(t, http.MethodPost, base+path, adminToken, `{"operator": "alice"}`)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, postgres.RedeliveryScheduled, body["result"])
	status, body = call(t, http.MethodPost, base+path, adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, postgres.RedeliveryAlreadyPending, body["result"], "idempotent")
	views, err := db.Notifications(ctx, "pending", 0, 10)
	require.NoError(t, err)
	require.Len(t, views, 3)
	for _, v := range views {
		if v.ID == due[0].ID {
			require.Equal(t, 1, v.Redeliveries)
			require.True(t, strings.HasPrefix(v.RedeliveryRequestedBy, "alice @127.0.0.1"), v.RedeliveryRequestedBy)
		}
	}

	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodGet, "/admin/notifications?state=open", "", http.StatusBadRequest},
		{http.MethodGet, "/admin/notifications?limit=1001", "", http.StatusBadRequest},
		{http.MethodGet, "/admin/notifications?limit=0", "", http.StatusBadRequest},
		{http.MethodGet, "/admin/notifications?before=x", "", http.StatusBadRequest},
		{http.MethodPost, "/admin/notifications/0/redeliver", "", http.StatusBadRequest},
		{http.MethodPost, "/admin/notifications/abc/redeliver", "", http.StatusBadRequest},
		{http.MethodPost, "/admin/notifications/999999/redeliver", "", http.StatusNotFound},
		{http.MethodPost, path, `{"who": "x"}`, http.StatusBadRequest},
		{http.MethodPost, path, `{"operator": "` + strings.Repeat("x", 201) + `"}`, http.StatusBadRequest},
		{http.MethodPost, path, `{"operator": "ann\u001b[2J"}`, http.StatusBadRequest},
		{http.MethodPost, path, `{"operator": "ann\nbob"}`, http.StatusBadRequest},
		{http.MethodPost, path, strings.Repeat(" ", 17<<10), http.StatusRequestEntityTooLarge},
	} {
		status, body := call(t, c.method, base+c.path, adminToken, c.body)
		require.Equal(t, c.status, status, "%s %s: %v", c.method, c.path, body)
		require.NotEmpty(t, body["error"])
		require.Equal(t, map[int]string{400: "invalid_request", 404: "not_found", 413: "body_too_large"}[c.status], body["code"])
	}
}

// TestRedeliverFailedInBulk: after a receiver was down past the attempts,
// one request sends its failed notifications again, a page at a time,
// leaving pending and delivered ones alone.
func TestRedeliverFailedInBulk(t *testing.T) {
	db, base := serve(t)
	notifications(t, db, 6)
	ctx := context.Background()
	due, err := db.ClaimNotifications(ctx, 6, 0)
	require.NoError(t, err)
	require.Len(t, due, 6)
	attempt := postgres.DeliveryAttempt{At: time.Now(), ErrorClass: "connection_refused"}
	for _, n := range due[:4] {
		moved, err := db.NotificationFailed(ctx, n, attempt, "connection refused", time.Hour, true)
		require.NoError(t, err)
		require.True(t, moved)
	}
	require.NoError(t, db.NotificationDelivered(ctx, due[4].ID, postgres.DeliveryAttempt{At: time.Now(), HTTPStatus: 204}))
	// due[5] stays pending, its next attempt an hour away.
	moved, err := db.NotificationFailed(ctx, due[5], attempt, "connection refused", time.Hour, false)
	require.NoError(t, err)
	require.True(t, moved)

	status, body := call(t, http.MethodPost, base+"/admin/notifications/redeliver", "", "")
	require.Equal(t, http.StatusUnauthorized, status, "behind the admin token")
	require.NotContains(t, body, "scheduled")
	views, err := db.Notifications(ctx, "failed", 0, 10)
	require.NoError(t, err)
	require.Len(t, views, 4, "nothing moved without the token")

	status, body = call(t, http.MethodPost, base+"/admin/notifications/redeliver", adminToken, `{"operator": "bob", "limit": 3}`)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, float64(3), body["scheduled"])
	require.Equal(t, true, body["more"])
	status, body = call(t, http.MethodPost, base+"/admin/notifications/redeliver", adminToken, "")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, float64(1), body["scheduled"])
	require.Equal(t, false, body["more"])
	status, body = call(t, http.MethodPost, base+"/admin/notifications/redeliver", adminToken, "")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, float64(0), body["scheduled"], "nothing failed is left")

	views, err = db.Notifications(ctx, "all", 0, 10)
	require.NoError(t, err)
	byID := map[int64]postgres.NotificationView{}
	for _, v := range views {
		byID[v.ID] = v
	}
	for i, n := range due[:4] {
		v := byID[n.ID]
		require.Equal(t, "pending", v.Status, "failed %d is due again", i)
		require.Equal(t, 0, v.Attempts, "with a fresh budget")
		require.Equal(t, 1, v.Redeliveries)
		require.True(t, v.NextAttemptAt.Before(time.Now().Add(time.Second)), "due now")
	}
	require.True(t, strings.HasPrefix(byID[due[0].ID].RedeliveryRequestedBy, "bob @127.0.0.1"), byID[due[0].ID].RedeliveryRequestedBy)
	require.True(t, strings.HasPrefix(byID[due[3].ID].RedeliveryRequestedBy, "admin-api @"), "the oldest page first")
	require.Equal(t, "delivered", byID[due[4].ID].Status, "a delivered one is not sent again")
	require.Equal(t, 0, byID[due[4].ID].Redeliveries)
	pending := byID[due[5].ID]
	require.Equal(t, 0, pending.Redeliveries, "a pending one keeps its schedule")
	require.Equal(t, 1, pending.Attempts)
	require.True(t, pending.NextAttemptAt.After(time.Now().Add(30*time.Minute)))

	for _, b := range []string{`{"limit": 0}`, `{"limit": 1001}`, `{"limit": "x"}`, `{"state": "delivered"}`, `{"operator": "` + strings.Repeat("x", 201) + `"}`} {
		status, body := call(t, http.MethodPost, base+"/admin/notifications/redeliver", adminToken, b)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", b, body)
		require.Equal(t, "invalid_request", body["code"])
	}
}
