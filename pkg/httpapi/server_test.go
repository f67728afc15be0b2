package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/console"
	"github.com/settle/settle/pkg/httpapi"
	notifyadmin "github.com/settle/settle/pkg/notify/admin"
)

// syncBuffer collects log lines written from handler goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	scanner := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for scanner.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(scanner.Bytes(), &line))
		out = append(out, line)
	}
	return out
}

// The caller's trace id (or a new UUID) is on every response, in every
// JSON error, in the stored event and in the request's log lines.
func TestTraceIDPropagation(t *testing.T) {
	logs := &syncBuffer{}
	h := newHarness(t, harnessOptions{log: logs})
	h.createUser(7)

	r := h.postPayment(deposit("trace-1", 7, "1"), httpapi.HeaderRequestID, "caller-trace-1")
	require.Equal(t, "caller-trace-1", r.header.Get(httpapi.HeaderRequestID))
	require.Equal(t, "caller-trace-1", r.body["trace_id"])
	e, err := h.db.Event(context.Background(), "trace-1")
	require.NoError(t, err)
	require.Equal(t, "caller-trace-1", e.TraceID)

	// Alchemy's header is honoured; X-Request-ID wins when both are sent.
	r = h.do(http.MethodGet, "/healthz", nil, map[string]string{httpapi.HeaderAlchemyRequestID: "alchemy-trace"})
	require.Equal(t, "alchemy-trace", r.header.Get(httpapi.HeaderRequestID))
	r = h.do(http.MethodGet, "/healthz", nil, map[string]string{httpapi.HeaderAlchemyRequestID: "alchemy-trace", httpapi.HeaderRequestID: "mine"})
	require.Equal(t, "mine", r.header.Get(httpapi.HeaderRequestID))

	// Invalid ids are replaced by a fresh UUID.
	for _, bad := range []string{strings.Repeat("x", 129), "has space", "tab\there", "é"} {
		r := h.do(http.MethodGet, "/healthz", nil, map[string]string{httpapi.HeaderRequestID: bad})
		require.Regexp(t, uuidPattern, r.header.Get(httpapi.HeaderRequestID), "%q replaced", bad)
	}
	require.Equal(t, strings.Repeat("x", 128), h.do(http.MethodGet, "/healthz", nil, map[string]string{httpapi.HeaderRequestID: strings.Repeat("x", 128)}).header.Get(httpapi.HeaderRequestID))

	// Every kind of answer carries one.
	for _, probe := range []struct{ method, path string }{
		{http.MethodGet, "/healthz"}, {http.MethodGet, "/readyz"}, {http.MethodGet, "/metrics"},
		{http.MethodGet, "/nope"}, {http.MethodGet, "/webhook/payments"}, {http.MethodGet, "/v1/users/7/balances"},
	} {
		r := h.do(probe.method, probe.path, nil, nil)
		// A UUID in its usual form: uuid.Parse also takes 32 bare digits.
		require.Regexp(t, uuidPattern, r.header.Get(httpapi.HeaderRequestID), "%s %s", probe.method, probe.path)
	}

	var traced int
	for _, line := range logs.lines(t) {
		if line["trace_id"] == "caller-trace-1" {
			traced++
		}
	}
	require.GreaterOrEqual(t, traced, 2, "the webhook's log lines carry its trace id")
}

// Echo's own answers (404, 405) and the body limit are JSON errors too.
func TestJSONErrorsEverywhere(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	requireError(t, h.do(http.MethodGet, "/nope", nil, nil), http.StatusNotFound)
	requireError(t, h.do(http.MethodGet, "/webhook/paymentsx", nil, nil), http.StatusNotFound)

	r := h.do(http.MethodGet, "/webhook/payments", nil, nil)
	requireError(t, r, http.StatusMethodNotAllowed)
	require.Contains(t, r.header.Get("Allow"), http.MethodPost)
	requireError(t, h.do(http.MethodDelete, "/healthz", nil, nil), http.StatusMethodNotAllowed)

	big := bytes.Repeat([]byte(" "), 70_000)
	requireError(t, h.do(http.MethodPost, "/webhook/payments", big, nil), http.StatusRequestEntityTooLarge)
	requireError(t, h.do(http.MethodPut, "/admin/users/1", big, bearer(adminToken)), http.StatusRequestEntityTooLarge)
	requireError(t, h.do(http.MethodPost, "/admin/deposit-addresses", big, bearer(adminToken)), http.StatusRequestEntityTooLarge)

	// Unknown routes are labelled as one value, so scanners cannot grow
	// the metric's label set.
	require.Equal(t, 2.0, counter(t, h.metrics, "settle_api_http_requests_total", map[string]string{"route": "unmatched", "status": "404"}))
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_http_requests_total", map[string]string{"route": "/webhook/payments", "status": "405"}))
}

// dlqStub stands in for the operations package's handlers.
func dlqRoutes(handler http.Handler) []httpapi.Route {
	return []httpapi.Route{
		{Method: http.MethodGet, Path: "/admin/dlq", Handler: handler},
		{Method: http.MethodPost, Path: "/admin/dlq/:id/replay", Handler: handler},
		{Method: http.MethodPost, Path: "/admin/dlq/:id/discard", Handler: handler},
	}
}

// A panic is recovered into a logged 500 JSON error with the trace id;
// its text never reaches the caller.
func TestPanicIsRecovered(t *testing.T) {
	logs := &syncBuffer{}
	panicking := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret internal state") })
	h := newHarness(t, harnessOptions{log: logs, change: func(o *httpapi.Options) { o.AdminRoutes = dlqRoutes(panicking) }})
	r := h.do(http.MethodGet, "/admin/dlq", nil, map[string]string{"Authorization": "Bearer " + adminToken, httpapi.HeaderRequestID: "panic-trace"})
	requireError(t, r, http.StatusInternalServerError)
	require.NotContains(t, string(r.raw), "secret")
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_panics_total", nil))

	found := false
	for _, line := range logs.lines(t) {
		if line["trace_id"] == "panic-trace" && line["panic"] == "secret internal state" {
			found = true
		}
	}
	require.True(t, found, "the panic is logged with the trace id")
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/healthz", nil, nil).status, "the server lives on")
}

// Routes contributed by other packages sit behind the admin token, get
// their path parameters and the trace id, and a mount accepts HTTP Basic.
func TestContributedAdminRoutes(t *testing.T) {
	echoParams := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": httpapi.PathParam(r, "id"), "trace": httpapi.TraceID(r.Context()), "path": r.URL.Path})
	})
	failing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, r, http.StatusNotFound, "no such entry")
	})
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.AdminRoutes = []httpapi.Route{
			{Method: http.MethodPost, Path: "/admin/dlq/:id/replay", Handler: echoParams},
			{Method: http.MethodPost, Path: "/admin/dlq/:id/discard", Handler: failing},
		}
		o.AdminMounts = []httpapi.Mount{{Prefix: "/admin/queues/", Handler: echoParams}}
	}})
	admin := map[string]string{"Authorization": "Bearer " + adminToken, httpapi.HeaderRequestID: "dlq-trace"}
	r := h.do(http.MethodPost, "/admin/dlq/17/replay", nil, admin)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, map[string]any{"id": "17", "trace": "dlq-trace", "path": "/admin/dlq/17/replay"}, r.body)
	requireError(t, h.do(http.MethodPost, "/admin/dlq/17/discard", nil, admin), http.StatusNotFound)
	requireError(t, h.do(http.MethodPost, "/admin/dlq/17/replay", nil, bearer(apiToken)), http.StatusUnauthorized)

	basic := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+adminToken))}
	r = h.do(http.MethodGet, "/admin/queues/api/queues", nil, basic)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "/admin/queues/api/queues", r.body["path"])
	r = h.do(http.MethodGet, "/admin/queues/", nil, nil)
	requireError(t, r, http.StatusUnauthorized)
	require.Contains(t, r.header.Get("WWW-Authenticate"), "Basic", "browsers are asked for credentials")
	wrong := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+apiToken))}
	requireError(t, h.do(http.MethodGet, "/admin/queues/", nil, wrong), http.StatusUnauthorized)
	// Basic is for the dashboard only.
	requireError(t, h.do(http.MethodPost, "/admin/dlq/17/replay", nil, basic), http.StatusUnauthorized)
}

func TestContributedRoutesMustBeInTheSpec(t *testing.T) {
	base := newHarness(t, harnessOptions{})
	opts := func(routes []httpapi.Route, mounts []httpapi.Mount) httpapi.Options {
		return httpapi.Options{
			Store: base.db, Redis: base.redis,
			WebhookSecret: webhookSecret, APIToken: apiToken, AdminToken: adminToken,
			AdminRoutes: routes, AdminMounts: mounts,
		}
	}
	handler := http.NotFoundHandler()
	for name, o := range map[string]httpapi.Options{
		"undocumented route": opts([]httpapi.Route{{Method: http.MethodGet, Path: "/admin/secret", Handler: handler}}, nil),
		"documented method":  opts([]httpapi.Route{{Method: http.MethodDelete, Path: "/admin/dlq", Handler: handler}}, nil),
		"built-in route":     opts([]httpapi.Route{{Method: http.MethodPut, Path: "/admin/users/:id", Handler: handler}}, nil),
		"outside /admin":     opts([]httpapi.Route{{Method: http.MethodGet, Path: "/healthz", Handler: handler}}, nil),
		"undocumented mount": opts(nil, []httpapi.Mount{{Prefix: "/admin/other/", Handler: handler}}),
	} {
		_, err := httpapi.New(o)
		require.Error(t, err, name)
	}
}

// The OpenAPI document and the router agree: every registered route is
// described, and every described operation is registered (the plug-in
// ones once their packages contribute them).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(httpapi.OpenAPISpec(), &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."))
	builtin, all := map[string]bool{}, map[string]bool{}
	for path, item := range doc.Paths {
		for method, op := range item {
			if method == "parameters" {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			all[key] = true
			operation, ok := op.(map[string]any)
			require.True(t, ok, key)
			if plugin, _ := operation["x-settle-plugin"].(bool); !plugin {
				builtin[key] = true
			}
		}
	}

	registered := func(h *harness) map[string]bool {
		out := map[string]bool{}
		for _, r := range h.server.Routes() {
			out[r.Method+" "+httpapi.SpecPath(r.Path)] = true
		}
		return out
	}
	// Every provider route configured: one without its secret does not
	// exist (TestProviderRoutesNeedTheirSecrets).
	providers := func(o *httpapi.Options) {
		o.QuickNodeTokens = []string{quickNodeToken}
		o.MoralisSecrets = []string{moralisSecret}
	}
	plain := newHarness(t, harnessOptions{change: providers})
	require.Equal(t, sortedKeys(builtin), sortedKeys(registered(plain)))

	// The routes the api binary really contributes, so the spec cannot
	// drift from them.
	full := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		providers(o)
		o.AdminRoutes = append(adminapi.Routes(nil), notifyadmin.Routes(nil)...)
		store, ok := o.Store.(console.Store)
		require.True(t, ok)
		operatorConsole, err := console.New(console.Options{Store: store, AdminToken: o.AdminToken})
		require.NoError(t, err)
		o.AdminMounts = []httpapi.Mount{adminapi.Dashboard(o.Redis, true), operatorConsole.Mount()}
	}})
	require.Equal(t, sortedKeys(all), sortedKeys(registered(full)))

	r := plain.do(http.MethodGet, "/openapi.yaml", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, httpapi.OpenAPISpec(), r.raw)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestHealthAndMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.do(http.MethodGet, "/healthz", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "ok", r.body["status"])
	require.Equal(t, "ok", r.body["redis"])

	r = h.do(http.MethodGet, "/readyz", nil, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, map[string]any{"postgres": "ok", "migrations": "current", "redis": "ok"}, r.body["checks"], "readiness is PostgreSQL, Redis and the schema")

	// A database behind this binary's migrations is not ready.
	execSQL(t, h.dsn, `DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)`)
	r = h.do(http.MethodGet, "/readyz", nil, nil)
	requireError(t, r, http.StatusServiceUnavailable)
	require.Equal(t, "pending", r.body["checks"].(map[string]any)["migrations"])

	r = h.do(http.MethodGet, "/metrics", nil, nil)
	require.Equal(t, http.StatusOK, r.status)
	text := string(r.raw)
	for _, want := range []string{
		`settle_api_http_requests_total{method="GET",route="/healthz",status="200"} 1`,
		`settle_api_http_request_duration_seconds_bucket{method="GET",route="/readyz",status="503"`,
		"settle_redis_up 1",
		// At 0 before any: SettleWebhook5xxRatio's rate() counts the first.
		`settle_api_http_requests_total{method="POST",route="/webhook/payments",status="503"} 0`,
		`settle_api_http_requests_total{method="POST",route="/webhook/moralis",status="500"} 0`,
	} {
		require.Contains(t, text, want)
	}
}

// Shutdown stops accepting, lets the request in flight finish, and
// returns nil.
func TestServeFinishesInFlightRequestsOnShutdown(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"finished":true}`)
	})
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.AdminRoutes = dlqRoutes(slow)[:1] }})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.server.Serve(ctx, listener, requestTimeout) }()

	answered := make(chan response, 1)
	go func() {
		req, err := http.NewRequest(http.MethodGet, "http://"+listener.Addr().String()+"/admin/dlq", nil)
		if err != nil {
			close(answered)
			return
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := (&http.Client{Timeout: requestTimeout}).Do(req)
		if err != nil {
			close(answered)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		answered <- response{status: resp.StatusCode, raw: raw}
	}()
	<-started
	stop()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a request was in flight", err)
	default:
	}
	close(release)
	r, ok := <-answered
	require.True(t, ok, "the in-flight request got an answer")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"finished":true}`, string(r.raw))
	require.NoError(t, <-served)
}
