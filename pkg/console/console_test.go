package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/console"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	adminToken    = "admin-token-0123456789-abcdefghijklmn"
	readOnlyToken = "readonly-token-0123456789-abcdefghijk"
	apiToken      = "api-token-0123456789-abcdefghijklmnop"
	webhookSecret = "webhook-secret-0123456789-abcdefghij"
	// requestTimeout is a safety net against hangs, never a timing
	// assertion.
	requestTimeout = time.Minute
)

// fixture is the real api (httpapi with the console mounted) over real
// HTTP, on a fresh PostgreSQL database.
type fixture struct {
	t      *testing.T
	db     *postgres.DB
	dsn    string
	url    string
	client *http.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	starter := &rescans{}
	c, err := console.New(console.Options{Store: db, AdminToken: adminToken, ReadOnlyToken: readOnlyToken,
		TraceURL: "https://traces.example/trace/{trace_id}", Rescans: starter})
	require.NoError(t, err)
	server, err := httpapi.New(httpapi.Options{
		Store: db, Redis: rdb, Log: zerolog.Nop(),
		WebhookSecret: webhookSecret, APIToken: apiToken, AdminToken: adminToken,
		AdminMounts: []httpapi.Mount{c.Mount()}, RescanBlocksMax: rescanBlocksMax,
	})
	require.NoError(t, err)
	starter.server = server
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)
	client := &http.Client{Timeout: requestTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &fixture{t: t, db: db, dsn: dsn, url: ts.URL, client: client}
}

// deadLetter stores a deposit and dead-letters it the way a worker does
// (claimed from the outbox, then failed to the DLQ); it returns the entry.
func (f *fixture) deadLetter(eventID string) int64 {
	f.t.Helper()
	ctx := context.Background()
	_, err := f.db.CreateUser(ctx, 1)
	require.NoError(f.t, err)
	_, err = f.db.InsertEvent(ctx, postgres.NewEvent{Source: postgres.SourcePayments, Event: payment.Event{
		ID: eventID, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1.5")}})
	require.NoError(f.t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, 1)
	require.NoError(f.t, err)
	require.Len(f.t, claimed, 1)
	moved, id, err := f.db.FailToDLQ(ctx, payment.DeadLetter{EventID: eventID, EventType: string(payment.Deposit), UserID: 1,
		Asset: "ETH", Amount: "1.5", Error: "forced failure", Generation: claimed[0].Event.Generation, Source: payment.SourceWorker})
	require.NoError(f.t, err)
	require.True(f.t, moved)
	return id
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) do(method, path string, auth func(*http.Request), form url.Values, header map[string]string) answer {
	f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, f.url+path, body)
	require.NoError(f.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if auth != nil {
		auth(req)
	}
	resp, err := f.client.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(data)}
}

func basic(user, token string) func(*http.Request) {
	return func(r *http.Request) { r.SetBasicAuth(user, token) }
}

func bearer(token string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }
}

// csrfField is the token every page carries (forms carry the same).
var csrfField = regexp.MustCompile(`name="csrf-token" content="([^"]+)"`)

// csrf is the token a page serves to auth.
func (f *fixture) csrf(path string, auth func(*http.Request)) string {
	f.t.Helper()
	a := f.do(http.MethodGet, path, auth, nil, nil)
	require.Equal(f.t, http.StatusOK, a.status, a.body)
	m := csrfField.FindStringSubmatch(a.body)
	require.NotNil(f.t, m, "the page has a CSRF token")
	return m[1]
}

// post sends a form as a browser on this origin does.
func (f *fixture) post(path string, auth func(*http.Request), form url.Values) answer {
	f.t.Helper()
	return f.do(http.MethodPost, path, auth, form, map[string]string{"Origin": f.url})
}

func (f *fixture) entry(id int64) postgres.DeadLetterView {
	f.t.Helper()
	v, err := f.db.DeadLetter(context.Background(), id)
	require.NoError(f.t, err)
	return v
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("dep-auth")
	entryPath := "/admin/console/dlq/" + itoa(id)

	for name, auth := range map[string]func(*http.Request){
		"none":            nil,
		"wrong token":     basic("ops", "not-the-token-0123456789-abcdefghijkl"),
		"api token":       bearer(apiToken),
		"empty password":  basic("ops", ""),
		"malformed basic": func(r *http.Request) { r.Header.Set("Authorization", "Basic !!!") },
	} {
		a := f.do(http.MethodGet, "/admin/console/", auth, nil, nil)
		require.Equal(t, http.StatusUnauthorized, a.status, name)
		require.Equal(t, []string{`Basic realm="settle"`, `Bearer realm="settle"`}, a.header.Values("WWW-Authenticate"),
			"%s: Basic on its own line, so browsers offer a login", name)
		var body map[string]any
		require.NoError(t, json.Unmarshal([]byte(a.body), &body), name)
		require.Equal(t, "unauthorized", body["code"], name)
		require.NotContains(t, a.body, adminToken)
	}

	// The read-only token looks: every page answers, no action is offered.
	for _, path := range []string{"/admin/console/", "/admin/console/dlq", entryPath, "/admin/console/event?id=dep-auth",
		"/admin/console/holds", "/admin/console/rescans", "/admin/console/events?q=1", "/admin/console/live"} {
		a := f.do(http.MethodGet, path, basic("viewer", readOnlyToken), nil, nil)
		require.Equal(t, http.StatusOK, a.status, path)
		require.NotContains(t, a.body, `method="post"`, "%s: no forms for the read-only role", path)
		require.NotContains(t, a.body, readOnlyToken)
	}
	a := f.do(http.MethodGet, "/admin/console/", bearer(readOnlyToken), nil, nil)
	require.Equal(t, http.StatusOK, a.status, "bearer works too")
	require.Contains(t, a.header.Get("Content-Security-Policy"), "default-src 'self'")

	// ...and cannot act, whatever it sends: 403 before anything is read.
	token := f.csrf(entryPath, basic("viewer", readOnlyToken))
	a = f.post(entryPath+"/replay", basic("viewer", readOnlyToken), url.Values{"csrf": {token}, "reason": {"try"}})
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.body, "read-only")
	require.Empty(t, f.entry(id).Resolution)

	// The admin token sees the forms and acts.
	adminPage := f.do(http.MethodGet, entryPath, basic("alice", adminToken), nil, nil)
	require.Contains(t, adminPage.body, `id="replay-form"`)
	require.Contains(t, adminPage.body, `id="discard-form"`)
	require.NotContains(t, adminPage.body, adminToken)
	token = f.csrf(entryPath, basic("alice", adminToken))
	a = f.post(entryPath+"/replay", basic("alice", adminToken), url.Values{"csrf": {token}, "reason": {"node was down"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, entryPath+"?done=replay%3Areopened", a.header.Get("Location"))
	v := f.entry(id)
	require.Equal(t, "replayed", v.Resolution)
	require.Equal(t, "node was down", v.Reason)
	require.Regexp(t, `^alice \(console, admin\) @127\.0\.0\.1$`, v.ResolvedBy, "who: the Basic user, the role, where from")
	require.Equal(t, "pending", v.EventStatus)

	// Replaying again is the operation's own no-op.
	a = f.post(entryPath+"/replay", basic("alice", adminToken), url.Values{"csrf": {token}, "reason": {"again"}})
	require.Equal(t, http.StatusSeeOther, a.status)
	require.Contains(t, a.header.Get("Location"), "already_replayed")
}

// TestNoPageAnswersJSON: a path or method no page serves answers in the
// API's error shape (the mux's plain text before), with Allow on a 405.
func TestNoPageAnswersJSON(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		method, path, code, allow string
		status                    int
	}{
		{http.MethodGet, "/admin/console/nope", "not_found", "", http.StatusNotFound},
		{http.MethodGet, "/admin/console/dlq/1/replay/more", "not_found", "", http.StatusNotFound},
		{http.MethodDelete, "/admin/console/", "method_not_allowed", "GET", http.StatusMethodNotAllowed},
		{http.MethodPost, "/admin/console/events", "method_not_allowed", "GET", http.StatusMethodNotAllowed},
		{http.MethodGet, "/admin/console/dlq/1/replay", "method_not_allowed", "POST", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/admin/console/rescans", "method_not_allowed", "GET, POST", http.StatusMethodNotAllowed},
	} {
		a := f.do(c.method, c.path, basic("alice", adminToken), nil, nil)
		require.Equal(t, c.status, a.status, "%s %s", c.method, c.path)
		var body map[string]any
		require.NoError(t, json.Unmarshal([]byte(a.body), &body), "%s %s: %s", c.method, c.path, a.body)
		require.Equal(t, c.code, body["code"], "%s %s", c.method, c.path)
		require.NotEmpty(t, body["trace_id"])
		require.Equal(t, c.allow, a.header.Get("Allow"), "%s %s", c.method, c.path)
	}
}

func TestCSRFRefusals(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("dep-csrf")
	entryPath := "/admin/console/dlq/" + itoa(id)
	admin := basic("alice", adminToken)
	good := f.csrf(entryPath, admin)
	viewerToken := f.csrf(entryPath, basic("viewer", readOnlyToken))

	cases := map[string]struct {
		form   url.Values
		header map[string]string
	}{
		"no token":                  {url.Values{"reason": {"r"}}, map[string]string{"Origin": f.url}},
		"forged token":              {url.Values{"csrf": {"1700000000.AAAA"}, "reason": {"r"}}, map[string]string{"Origin": f.url}},
		"another credential's form": {url.Values{"csrf": {viewerToken}, "reason": {"r"}}, map[string]string{"Origin": f.url}},
		"another site's origin":     {url.Values{"csrf": {good}, "reason": {"r"}}, map[string]string{"Origin": "https://evil.example"}},
		"cross-site fetch":          {url.Values{"csrf": {good}, "reason": {"r"}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		"null origin":               {url.Values{"csrf": {good}, "reason": {"r"}}, map[string]string{"Origin": "null"}},
	}
	for name, c := range cases {
		a := f.do(http.MethodPost, entryPath+"/discard", admin, c.form, c.header)
		require.Equal(t, http.StatusForbidden, a.status, name)
		require.Empty(t, f.entry(id).Resolution, "%s: nothing done", name)
	}

	// An expired form: a console whose clock is past the token's life.
	later, err := console.New(console.Options{Store: f.db, AdminToken: adminToken, Now: func() time.Time { return time.Now().Add(13 * time.Hour) }})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, entryPath+"/discard", strings.NewReader(url.Values{"csrf": {good}, "reason": {"r"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("alice", adminToken)
	rec := httptest.NewRecorder()
	later.ServeHTTP(rec, req)
	require.Equal(t, http.StatusForbidden, rec.Code, "a form older than its life")
	require.Empty(t, f.entry(id).Resolution)

	// The same form, fresh, from this origin, acts.
	a := f.post(entryPath+"/discard", admin, url.Values{"csrf": {good}, "reason": {"duplicate of a manual credit"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "discarded", f.entry(id).Resolution)
}

func TestReasonRequired(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("dep-reason")
	entryPath := "/admin/console/dlq/" + itoa(id)
	admin := basic("alice", adminToken)
	token := f.csrf(entryPath, admin)
	for _, action := range []string{"replay", "discard"} {
		for _, reason := range []string{"", "   ", strings.Repeat("x", 1001), "clear \x1b[2J screen"} {
			a := f.post(entryPath+"/"+action, admin, url.Values{"csrf": {token}, "reason": {reason}})
			require.Equal(t, http.StatusBadRequest, a.status, "%s with reason %q", action, reason)
			require.Empty(t, f.entry(id).Resolution)
		}
	}
	// A textarea's lines are taken.
	a := f.post(entryPath+"/discard", admin, url.Values{"csrf": {token}, "reason": {"paid by hand\r\nticket 12"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "paid by hand\r\nticket 12", f.entry(id).Reason)
	id = f.deadLetter("dep-reason-2")
	a = f.post("/admin/console/dlq/bulk-replay", admin, url.Values{"csrf": {token}, "id": {itoa(id)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusBadRequest, a.status, "a bulk replay needs one too")
	a = f.post("/admin/console/event/recheck", admin, url.Values{"csrf": {token}, "id": {"dep-reason-2"}})
	require.Equal(t, http.StatusBadRequest, a.status, "so does a recheck")
	require.Empty(t, f.entry(id).Resolution)
}

func TestBulkReplayAsksFirst(t *testing.T) {
	f := newFixture(t)
	first := f.deadLetter("dep-bulk-1")
	second := f.deadLetter("dep-bulk-2")
	admin := basic("alice", adminToken)
	list := f.do(http.MethodGet, "/admin/console/dlq", admin, nil, nil)
	require.Equal(t, http.StatusOK, list.status)
	require.Contains(t, list.body, `id="bulk-form"`)
	token := csrfField.FindStringSubmatch(list.body)[1]
	form := url.Values{"csrf": {token}, "reason": {"RPC outage over"}, "id": {itoa(first), itoa(second)}}

	a := f.post("/admin/console/dlq/bulk-replay", admin, form)
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Contains(t, a.body, "Replay 2 dead letters?")
	require.Contains(t, a.body, "dep-bulk-1")
	require.Contains(t, a.body, "dep-bulk-2")
	require.Contains(t, a.body, `name="confirm" value="yes"`)
	require.Empty(t, f.entry(first).Resolution, "nothing replayed before the confirmation")
	require.Empty(t, f.entry(second).Resolution)

	form.Set("confirm", "yes")
	a = f.post("/admin/console/dlq/bulk-replay", admin, form)
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Contains(t, a.body, `id="bulk-results"`)
	for _, id := range []int64{first, second} {
		v := f.entry(id)
		require.Equal(t, "replayed", v.Resolution)
		require.Equal(t, "RPC outage over", v.Reason)
		require.Equal(t, "pending", v.EventStatus)
	}
	// Confirming twice replays nothing twice.
	a = f.post("/admin/console/dlq/bulk-replay", admin, form)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, 2, strings.Count(a.body, "already_replayed"))

	tooMany := url.Values{"csrf": {token}, "reason": {"r"}, "confirm": {"yes"}}
	for i := range 101 {
		tooMany.Add("id", itoa(int64(i+1)))
	}
	require.Equal(t, http.StatusBadRequest, f.post("/admin/console/dlq/bulk-replay", admin, tooMany).status)
}

func TestStoryAndSearch(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("dep-story")
	admin := basic("alice", adminToken)
	ctx := context.Background()
	_, err := f.db.ReplayDeadLetter(ctx, id, "test", "to see the story")
	require.NoError(t, err)

	// A search by exact event id goes to the story.
	a := f.do(http.MethodGet, "/admin/console/events?q=dep-story", admin, nil, nil)
	require.Equal(t, http.StatusSeeOther, a.status)
	require.Equal(t, "/admin/console/event?id=dep-story", a.header.Get("Location"))
	a = f.do(http.MethodGet, "/admin/console/event?id=dep-story", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	for _, want := range []string{`data-status="pending"`, "forced failure", "replayed by test: to see the story", "accepted from payments as pending", "hx-get="} {
		require.Contains(t, a.body, want)
	}
	require.Contains(t, a.body, "no provider (the api's own webhook, or the scanner)")
	// The providers that reported its transfer, first first.
	require.NoError(t, f.db.RecordReports(ctx, "quicknode", []string{"dep-story"}))
	require.NoError(t, f.db.RecordReports(ctx, "alchemy", []string{"dep-story"}))
	a = f.do(http.MethodGet, "/admin/console/event?id=dep-story", admin, nil, nil)
	require.Regexp(t, `quicknode \([^)]*\), alchemy \(`, a.body)
	require.Contains(t, a.body, "reported by alchemy")
	// A user id lists the user's events; an unknown id says so.
	a = f.do(http.MethodGet, "/admin/console/events?q=1", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, "dep-story")
	a = f.do(http.MethodGet, "/admin/console/events?q=no-such-event", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, `id="no-match"`)
	a = f.do(http.MethodGet, "/admin/console/event?id=no-such-event", admin, nil, nil)
	require.Equal(t, http.StatusNotFound, a.status)
	a = f.do(http.MethodGet, "/admin/console/events?q=0x"+strings.Repeat("ab", 32), admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)

	// The overview shows the backlog, the scanner's state and the DLQ.
	a = f.do(http.MethodGet, "/admin/console/", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, `id="backlog"`)
	require.Contains(t, a.body, `id="scanner"`)
	require.Contains(t, a.body, "dep-story")
}

// TestVendoredHTMX pins the vendored script to the release it says it is.
func TestVendoredHTMX(t *testing.T) {
	data, err := os.ReadFile("static/htmx.min.js")
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	require.Equal(t, "a0abb04f2f45a1f89d1d4844023245537e5e6014c87b144553e0607b4cc32130", hex.EncodeToString(sum[:]))
	require.Contains(t, string(data), `version="4.0.1"`)
	readme, err := os.ReadFile("static/README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), hex.EncodeToString(sum[:]))
}

func itoa(n int64) string { return decimal.NewFromInt(n).String() }

// rescans starts jobs through the api's own POST /admin/rescan operation,
// as cmd/api wires it (the server exists only after the console).
type rescans struct{ server *httpapi.Server }

func (r *rescans) StartRescan(ctx context.Context, network string, from, to uint64, operator string) (string, error) {
	return r.server.StartRescan(ctx, network, from, to, operator)
}

// rescanBlocksMax is the fixture's RESCAN_BLOCKS_MAX.
const rescanBlocksMax = 1000

func TestHoldsAndRescans(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.db.CreateUser(ctx, 7)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// A hold row as the ledger leaves it (the console only reads holds).
	_, err = conn.Exec(ctx, `INSERT INTO holds (hold_id, user_id, asset, amount, network) VALUES ('hold-1', 7, 'USDC', 12.5, 'ETH_MAINNET')`)
	require.NoError(t, err)
	admin := basic("alice", adminToken)
	a := f.do(http.MethodGet, "/admin/console/holds?user=7&status=open", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, "hold-1")
	require.Contains(t, a.body, "12.5 USDC")
	a = f.do(http.MethodGet, "/admin/console/holds?status=posted", admin, nil, nil)
	require.NotContains(t, a.body, "hold-1")
	require.Equal(t, http.StatusBadRequest, f.do(http.MethodGet, "/admin/console/holds?status=gone", admin, nil, nil).status)
	a = f.do(http.MethodGet, "/admin/console/hold?id=hold-1", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, "open: its amount is reserved")

	// A rescan started from the form, with its reason, shows its progress.
	token := f.csrf("/admin/console/rescans", admin)
	form := url.Values{"csrf": {token}, "network": {"ETH_MAINNET"}, "from_block": {"100"}, "to_block": {"199"}}
	require.Equal(t, http.StatusBadRequest, f.post("/admin/console/rescans", admin, form).status, "no reason")
	form.Set("reason", "an outage of the provider's webhooks")
	require.Equal(t, http.StatusForbidden, f.post("/admin/console/rescans", basic("viewer", readOnlyToken), form).status)
	a = f.post("/admin/console/rescans", admin, form)
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	var jobID string
	require.NoError(t, conn.QueryRow(ctx, `SELECT id FROM rescan_jobs WHERE network = 'ETH_MAINNET' AND from_block = 100 AND to_block = 199`).Scan(&jobID))
	job, err := f.db.Rescan(ctx, jobID)
	require.NoError(t, err)
	require.Equal(t, "running", job.Status)
	// Who asked and why is stored with the job, not only logged.
	require.Equal(t, "admin", job.RequestedBy)
	require.Contains(t, job.Operator, "(console, admin)")
	require.True(t, strings.HasSuffix(job.Operator, ": an outage of the provider's webhooks"), job.Operator)
	a = f.do(http.MethodGet, "/admin/console/rescans", admin, nil, nil)
	require.Contains(t, a.body, jobID)
	require.Contains(t, a.body, "0/100")
	require.Contains(t, a.body, html.EscapeString(job.Operator))
	require.NotContains(t, a.body, "waiting: finality head")
	// A job the scanner found above the finality head says it waits.
	_, err = conn.Exec(ctx, `UPDATE rescan_jobs SET waiting_head = 42 WHERE id = $1`, jobID)
	require.NoError(t, err)
	a = f.do(http.MethodGet, "/admin/console/rescans", admin, nil, nil)
	require.Contains(t, a.body, "waiting: finality head 42")
	require.NotContains(t, a.body, "restarted")
	// A job the branch changed under says how often it restarted, and why.
	_, err = conn.Exec(ctx, `UPDATE rescan_jobs SET restarts = 2, last_restart_at = now(),
		last_restart_reason = 'the branch changed under the job between its passes: block 149; reading again from block 100' WHERE id = $1`, jobID)
	require.NoError(t, err)
	a = f.do(http.MethodGet, "/admin/console/rescans", admin, nil, nil)
	require.Contains(t, a.body, "restarted 2×, last ")
	require.Contains(t, a.body, "block 149; reading again from block 100")
	// The admin API's own rules refuse, and say why.
	for name, change := range map[string]url.Values{
		"to before from":         {"to_block": {"99"}},
		"over RESCAN_BLOCKS_MAX": {"to_block": {"1100"}},
		"unknown network":        {"network": {"NOPE_MAINNET"}},
	} {
		bad := url.Values{}
		for k, v := range form {
			bad[k] = v
		}
		for k, v := range change {
			bad[k] = v
		}
		a = f.post("/admin/console/rescans", admin, bad)
		require.Equal(t, http.StatusBadRequest, a.status, name)
		require.Contains(t, a.body, "Refused", name)
	}
	require.Equal(t, 1, countRows(t, conn, `SELECT count(*) FROM rescan_jobs`))
}

// TestRescanCancel: a running job's row has a Cancel form; it ends the
// job through the store's cancel (failed, the error naming the operator,
// the role, the address and the reason), guarded like every action; a
// job that ended has no form and a second cancel is refused.
func TestRescanCancel(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.db.CreateRescan(ctx, "rescan-typo", "ETH_MAINNET", 30_000_000, 30_000_100, "bob")
	require.NoError(t, err)
	_, err = f.db.CreateRescan(ctx, "rescan-other", "ETH_MAINNET", 1, 2, "bob")
	require.NoError(t, err)
	admin := basic("alice", adminToken)
	page := f.do(http.MethodGet, "/admin/console/rescans", admin, nil, nil)
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, page.body, `action="/admin/console/rescans/rescan-typo/cancel"`)
	require.NotContains(t, f.do(http.MethodGet, "/admin/console/rescans", basic("viewer", readOnlyToken), nil, nil).body, "/cancel")
	cancelPath := "/admin/console/rescans/rescan-typo/cancel"
	token := csrfField.FindStringSubmatch(page.body)[1]

	require.Equal(t, http.StatusBadRequest, f.post(cancelPath, admin, url.Values{"csrf": {token}, "reason": {" "}}).status, "no reason")
	require.Equal(t, http.StatusForbidden, f.post(cancelPath, admin, url.Values{"reason": {"typo"}}).status, "no CSRF token")
	viewerToken := f.csrf("/admin/console/rescans", basic("viewer", readOnlyToken))
	require.Equal(t, http.StatusForbidden, f.post(cancelPath, basic("viewer", readOnlyToken), url.Values{"csrf": {viewerToken}, "reason": {"typo"}}).status)
	job, err := f.db.Rescan(ctx, "rescan-typo")
	require.NoError(t, err)
	require.Equal(t, "running", job.Status, "refusals change nothing")

	a := f.post(cancelPath, admin, url.Values{"csrf": {token}, "reason": {"typo: block 3,000,000 meant"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/admin/console/rescans?done=rescan%3Acancelled", a.header.Get("Location"))
	job, err = f.db.Rescan(ctx, "rescan-typo")
	require.NoError(t, err)
	require.Equal(t, "failed", job.Status)
	require.Regexp(t, `^cancelled by alice \(console, admin\) @127\.0\.0\.1: typo: block 3,000,000 meant$`, job.Error)
	other, err := f.db.Rescan(ctx, "rescan-other")
	require.NoError(t, err)
	require.Equal(t, "running", other.Status, "only the job named")

	page = f.do(http.MethodGet, "/admin/console/rescans?done=rescan%3Acancelled", admin, nil, nil)
	require.Contains(t, page.body, "Rescan cancelled")
	require.Contains(t, page.body, html.EscapeString(job.Error))
	require.NotContains(t, page.body, cancelPath, "an ended job has no Cancel")
	require.Contains(t, page.body, "/admin/console/rescans/rescan-other/cancel")

	a = f.post(cancelPath, admin, url.Values{"csrf": {token}, "reason": {"again"}})
	require.Equal(t, http.StatusConflict, a.status)
	require.Contains(t, a.body, "already ended")
	a = f.post("/admin/console/rescans/rescan-nope/cancel", admin, url.Values{"csrf": {token}, "reason": {"typo"}})
	require.Equal(t, http.StatusNotFound, a.status)
}

// A schema without the scanner's tables (before migration 0013, or a
// deployment that dropped them) still serves the console.
func TestWithoutScannerTables(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DROP TABLE chain_cursors, rescan_found, rescan_jobs`)
	require.NoError(t, err)
	admin := basic("alice", adminToken)
	a := f.do(http.MethodGet, "/admin/console/", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, "Scanner not configured")
	require.NotContains(t, a.body, "Could not read")
	a = f.do(http.MethodGet, "/admin/console/rescans", admin, nil, nil)
	require.Equal(t, http.StatusOK, a.status)
	require.Contains(t, a.body, `id="rescans-none"`)
}

// An id with characters a URL must escape links to its own story.
func TestOddEventIDs(t *testing.T) {
	f := newFixture(t)
	admin := basic("alice", adminToken)
	// An id with characters a URL must escape links to its own story.
	odd := "chain:ETH_MAINNET:0xab/7 a&b=c%d"
	f.deadLetter(odd)
	a := f.do(http.MethodGet, "/admin/console/dlq", admin, nil, nil)
	links := regexp.MustCompile(`href="(/admin/console/event\?id=[^"]+)"`).FindAllStringSubmatch(a.body, -1)
	found := false
	for _, link := range links {
		href := strings.ReplaceAll(link[1], "&amp;", "&")
		u, err := url.Parse(href)
		require.NoError(t, err)
		if u.Query().Get("id") != odd {
			continue
		}
		found = true
		story := f.do(http.MethodGet, href, admin, nil, nil)
		require.Equal(t, http.StatusOK, story.status, href)
		require.Contains(t, story.body, "forced failure")
	}
	require.True(t, found, "the list links the odd id's story: %v", links)

}

func countRows(t *testing.T, conn *pgx.Conn, query string) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// Every action refuses the read-only role, before reading its form.
func TestReadOnlyCannotAct(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("dep-readonly")
	viewer := basic("viewer", readOnlyToken)
	token := f.csrf("/admin/console/", viewer)
	form := url.Values{"csrf": {token}, "reason": {"just looking"}, "id": {itoa(id)}, "confirm": {"yes"},
		"network": {"ETH_MAINNET"}, "from_block": {"1"}, "to_block": {"2"}}
	for _, path := range []string{"/admin/console/dlq/" + itoa(id) + "/replay", "/admin/console/dlq/" + itoa(id) + "/discard",
		"/admin/console/dlq/bulk-replay", "/admin/console/event/recheck", "/admin/console/rescans"} {
		a := f.post(path, viewer, form)
		require.Equal(t, http.StatusForbidden, a.status, path)
	}
	require.Empty(t, f.entry(id).Resolution)
	conn, err := pgx.Connect(context.Background(), f.dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.Zero(t, countRows(t, conn, `SELECT count(*) FROM rescan_jobs`))
	require.Zero(t, countRows(t, conn, `SELECT count(*) FROM event_rechecks`))
}

// A recheck goes through the admin API's Rechecker and is recorded with
// who asked and why; an event no recheck can reverse is not_applicable
// without asking the chain (so the Rechecker needs no gate here).
func TestRecheckIsRecorded(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	c, err := console.New(console.Options{Store: db, AdminToken: adminToken, Chain: finality.NewRechecker(nil, db)})
	require.NoError(t, err)
	f := &fixture{t: t, db: db, dsn: dsn}
	f.deadLetter("dep-recheck")
	ts := httptest.NewServer(c)
	t.Cleanup(ts.Close)
	f.url = ts.URL
	f.client = &http.Client{Timeout: requestTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	admin := basic("alice", adminToken)
	token := f.csrf("/admin/console/event?id=dep-recheck", admin)
	a := f.post("/admin/console/event/recheck", admin, url.Values{"csrf": {token}, "id": {"dep-recheck"}, "reason": {"customer says it landed"}})
	require.Equal(t, http.StatusSeeOther, a.status, a.body)
	require.Equal(t, "/admin/console/event?done=recheck%3Anot_applicable&id=dep-recheck", a.header.Get("Location"))
	rechecks, err := db.Rechecks(context.Background(), "dep-recheck")
	require.NoError(t, err)
	require.Len(t, rechecks, 1)
	require.Regexp(t, `^alice \(console, admin\) @.*: customer says it landed$`, rechecks[0].RequestedBy)
	story := f.do(http.MethodGet, "/admin/console/event?id=dep-recheck&done=recheck:not_applicable", admin, nil, nil)
	require.Contains(t, story.body, "not a failed deposit a recheck can reverse")
	require.Contains(t, story.body, "customer says it landed")
}

// The console is an admin route: with ADMIN_ADDR the public listener
// answers it 404 without asking for credentials.
func TestConsoleOnlyOnTheAdminListener(t *testing.T) {
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := console.New(console.Options{Store: db, AdminToken: adminToken})
	require.NoError(t, err)
	server, err := httpapi.New(httpapi.Options{Store: db, Redis: rdb, Log: zerolog.Nop(), WebhookSecret: webhookSecret,
		APIToken: apiToken, AdminToken: adminToken, AdminMounts: []httpapi.Mount{c.Mount()}})
	require.NoError(t, err)
	public, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminListener, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.ServeSplit(ctx, public, adminListener, 5*time.Second) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-served) })
	client := &http.Client{Timeout: requestTimeout}
	get := func(base string) (int, http.Header) {
		req, err := http.NewRequest(http.MethodGet, "http://"+base+"/admin/console/", nil)
		require.NoError(t, err)
		req.SetBasicAuth("alice", adminToken)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	status, header := get(public.Addr().String())
	require.Equal(t, http.StatusNotFound, status)
	require.Empty(t, header.Values("WWW-Authenticate"))
	status, _ = get(adminListener.Addr().String())
	require.Equal(t, http.StatusOK, status)
}
