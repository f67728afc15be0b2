package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	webhookSecret = "webhook-secret-0123456789-abcdefghij"
	apiToken      = "api-token-0123456789-abcdefghijklmnop"
	adminToken    = "admin-token-0123456789-abcdefghijklmn"
	alchemyKey    = "whsec_alchemy-key-one"
	alchemyKey2   = "whsec_alchemy-key-two"
	// requestTimeout bounds every test request; it is a safety net
	// against hangs, never a timing assertion.
	requestTimeout = time.Minute
)

// fixedNow pins the rate limiter's clock, so a test never straddles a
// window boundary.
var fixedNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type harness struct {
	t        testing.TB
	db       *postgres.DB
	dsn      string
	server   *httpapi.Server
	url      string
	client   *http.Client
	metrics  *prometheus.Registry
	redisURL string
	redis    *redis.Client
}

type harnessOptions struct {
	dsn      string // empty: a fresh database from testenv
	redisURL string // empty: a fresh Redis database from testenv
	log      io.Writer
	change   func(*httpapi.Options)
}

// newHarness runs a Server over real HTTP against real PostgreSQL and
// Redis.
func newHarness(t testing.TB, ho harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, dsn: ho.dsn, redisURL: ho.redisURL, metrics: prometheus.NewRegistry()}
	if h.dsn == "" {
		h.dsn = testenv.DatabaseURL(t)
	}
	if h.redisURL == "" {
		h.redisURL = testenv.RedisURL(t)
	}
	h.db = testenv.OpenDB(t, h.dsn)
	redisOpts, err := redis.ParseURL(h.redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(redisOpts)
	t.Cleanup(func() { _ = rdb.Close() })
	h.redis = rdb

	log := zerolog.Nop()
	if ho.log != nil {
		log = zerolog.New(ho.log)
	}
	opts := httpapi.Options{
		Store:              h.db,
		Redis:              rdb,
		Log:                log,
		Registry:           h.metrics,
		WebhookSecret:      webhookSecret,
		AlchemySigningKeys: []string{alchemyKey, alchemyKey2},
		APIToken:           apiToken,
		AdminToken:         adminToken,
		Now:                func() time.Time { return fixedNow },
		// A loaded machine must not push a Redis call into the fallback.
		RateLimitTimeout: requestTimeout,
	}
	if ho.change != nil {
		ho.change(&opts)
	}
	h.server, err = httpapi.New(opts)
	require.NoError(t, err)
	ts := httptest.NewServer(h.server)
	t.Cleanup(ts.Close)
	h.url = ts.URL
	h.client = &http.Client{Timeout: requestTimeout}
	return h
}

// response is an answer with its JSON body decoded.
type response struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (h *harness) do(method, path string, body []byte, headers map[string]string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, bytes.NewReader(body))
	require.NoError(h.t, err)
	if body == nil {
		req.Body = http.NoBody
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return h.send(req)
}

func (h *harness) send(req *http.Request) response {
	h.t.Helper()
	resp, err := h.client.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	r := response{status: resp.StatusCode, header: resp.Header, raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(h.t, json.Unmarshal(raw, &r.body), "body %s", raw)
	}
	return r
}

func sign(body []byte) string { return alchemy.Sign(body, []byte(webhookSecret)) }

// postPayment sends a correctly signed payments webhook.
func (h *harness) postPayment(body []byte, headers ...string) response {
	h.t.Helper()
	hdr := map[string]string{"Content-Type": "application/json", httpapi.HeaderSignature: sign(body)}
	for i := 0; i+1 < len(headers); i += 2 {
		hdr[headers[i]] = headers[i+1]
	}
	return h.do(http.MethodPost, "/webhook/payments", body, hdr)
}

func (h *harness) postAlchemy(body []byte, key string, headers ...string) response {
	h.t.Helper()
	hdr := map[string]string{"Content-Type": "application/json", httpapi.HeaderAlchemySignature: alchemy.Sign(body, []byte(key))}
	for i := 0; i+1 < len(headers); i += 2 {
		hdr[headers[i]] = headers[i+1]
	}
	return h.do(http.MethodPost, "/webhook/alchemy", body, hdr)
}

func bearer(token string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token}
}

func (h *harness) createUser(id int64) {
	h.t.Helper()
	r := h.do(http.MethodPut, fmt.Sprintf("/admin/users/%d", id), nil, bearer(adminToken))
	require.Contains(h.t, []int{http.StatusCreated, http.StatusOK}, r.status, "create user: %s", r.raw)
}

func (h *harness) addAddress(user int64, network, address string) response {
	h.t.Helper()
	body, err := json.Marshal(map[string]any{"address": address, "network": network, "user_id": user})
	require.NoError(h.t, err)
	return h.do(http.MethodPost, "/admin/deposit-addresses", body, bearer(adminToken))
}

// payment builds a body from fields; raw JSON values are spliced as given.
func paymentBody(fields map[string]string) []byte {
	var parts []string
	for _, k := range []string{"event_id", "event_type", "user_id", "amount", "asset", "tx_hash"} {
		if v, ok := fields[k]; ok {
			parts = append(parts, fmt.Sprintf("%q:%s", k, v))
		}
	}
	for k, v := range fields {
		switch k {
		case "event_id", "event_type", "user_id", "amount", "asset", "tx_hash":
		default:
			parts = append(parts, fmt.Sprintf("%q:%s", k, v))
		}
	}
	return []byte("{" + strings.Join(parts, ",") + "}")
}

// deposit is a valid body for event id.
func deposit(id string, user int64, amount string) []byte {
	return paymentBody(map[string]string{
		"event_id": fmt.Sprintf("%q", id), "event_type": `"deposit"`,
		"user_id": fmt.Sprint(user), "amount": fmt.Sprintf("%q", amount),
	})
}

// countEvents reads payment_events directly: the test's independent view
// of what was stored.
func (h *harness) countEvents() int {
	h.t.Helper()
	return countRows(h.t, h.dsn, "SELECT count(*) FROM payment_events")
}

var connMu sync.Mutex

func countRows(t testing.TB, dsn, query string, args ...any) int {
	t.Helper()
	connMu.Lock()
	defer connMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, query, args...).Scan(&n))
	return n
}

func execSQL(t testing.TB, dsn, statement string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, statement, args...)
	require.NoError(t, err)
}

// requireError checks the JSON error shape (a known code among them) and
// that its trace id is the one in X-Request-ID.
func requireError(t *testing.T, r response, status int) {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.raw)
	require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "application/json"), "content type %q", r.header.Get("Content-Type"))
	require.NotEmpty(t, r.body["error"], "body %s", r.raw)
	require.Contains(t, httpapi.Codes(), r.body["code"], "body %s", r.raw)
	require.NotEmpty(t, r.header.Get(httpapi.HeaderRequestID))
	require.Equal(t, r.header.Get(httpapi.HeaderRequestID), r.body["trace_id"])
}

// counter reads a counter's value from the registry by its labels.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for name, value := range labels {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == name && l.GetValue() == value {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

// requireCode is requireError with the expected code.
func requireCode(t *testing.T, r response, status int, code string) {
	t.Helper()
	requireError(t, r, status)
	require.Equal(t, code, r.body["code"], "body %s", r.raw)
}
