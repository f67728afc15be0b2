package adminapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/testenv"
)

// TestDashboardMetricsTab: with a Prometheus URL, asynqmon's Metrics tab
// asks that Prometheus for asynq's queue series; without one it has none.
func TestDashboardMetricsTab(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.Path+"?"+r.URL.Query().Get("query"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"success","data":{"resultType":"matrix","result":[]}}`)
	}))
	t.Cleanup(prom.Close)

	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })

	get := func(mount httpapi.Mount, path string) (int, string) {
		server, err := httpapi.New(httpapi.Options{
			Store: db, Redis: rdb, Log: zerolog.Nop(),
			WebhookSecret: "webhook-secret-0123456789abcdefghijkl", APIToken: apiToken, AdminToken: adminToken,
			AdminMounts: []httpapi.Mount{mount},
		})
		require.NoError(t, err)
		ts := httptest.NewServer(server)
		defer ts.Close()
		req, err := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		require.NoError(t, err)
		req.SetBasicAuth("admin", adminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	status, page := get(adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: true, PrometheusURL: prom.URL}), "/admin/queues/")
	require.Equal(t, http.StatusOK, status)
	// The page names it in a script, slashes escaped.
	flag := `FLAG_PROMETHEUS_SERVER_ADDRESS="` + strings.ReplaceAll(prom.URL, "/", `\/`) + `"`
	require.Contains(t, page, flag, "the UI shows the Metrics tab only when it knows a Prometheus")
	status, _ = get(adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: true, PrometheusURL: prom.URL}), "/admin/queues/api/metrics")
	require.Equal(t, http.StatusOK, status)
	mu.Lock()
	require.NotEmpty(t, queries)
	for _, q := range queries {
		require.True(t, strings.HasPrefix(q, "/api/v1/query_range?"), q)
	}
	require.Contains(t, strings.Join(queries, "\n"), "asynq_")
	mu.Unlock()

	_, page = get(adminapi.Dashboard(rdb, true), "/admin/queues/")
	require.Contains(t, page, `FLAG_PROMETHEUS_SERVER_ADDRESS=""`)
}
