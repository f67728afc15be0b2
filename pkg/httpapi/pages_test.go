package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
)

// execer is a connection or a transaction.
type execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// insertEvents stores pending deposits of user straight into the outbox
// on conn, in one statement.
func insertEvents(ctx context.Context, q execer, user int64, ids []string) error {
	_, err := q.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash)
		SELECT id, 'deposit', $2, 'ETH', 1, sha256(convert_to(id, 'UTF8')) FROM unnest($1::text[]) id`, ids, user)
	return err
}

// page fetches one page of a list and decodes it.
type pageJSON struct {
	Events  []map[string]any `json:"events"`
	Entries []map[string]any `json:"entries"`
	HasMore bool             `json:"has_more"`
	Next    *string          `json:"next"`
	Resume  *string          `json:"resume"`
}

func (h *harness) page(path string, query url.Values) (response, pageJSON) {
	h.t.Helper()
	r := h.do(http.MethodGet, path+"?"+query.Encode(), nil, bearer(apiToken))
	var p pageJSON
	if r.status == http.StatusOK {
		require.NoError(h.t, json.Unmarshal(r.raw, &p))
	}
	return r, p
}

// pageAll follows a list to its current end from after ("": the start)
// and returns the ids it showed, in order, and the cursor to resume
// from. It loops while next is set, as a plain client does, and checks
// that next is set exactly while has_more is.
func (h *harness) pageAll(path string, query url.Values, after string, idField string) ([]string, string) {
	h.t.Helper()
	var ids []string
	for range 10_000 {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		if after != "" {
			q.Set("after", after)
		}
		r, p := h.page(path, q)
		require.Equal(h.t, http.StatusOK, r.status, "%s", r.raw)
		for _, row := range append(p.Events, p.Entries...) {
			ids = append(ids, fmt.Sprint(row[idField]))
		}
		require.Equal(h.t, p.HasMore, p.Next != nil, "next is set exactly while has_more is: %s", r.raw)
		if p.Next != nil {
			require.Equal(h.t, *p.Next, *p.Resume)
		}
		if p.Resume != nil {
			after = *p.Resume
		}
		if p.Next == nil {
			return ids, after
		}
		after = *p.Next
	}
	h.t.Fatal("the list never ended")
	return nil, ""
}

// Paging while two other connections insert events, some in transactions
// held open for a while (a row that commits late but was inserted early,
// which any order by time would skip), shows every event exactly once:
// page to the end, then on from the last cursor once the inserts are done.
func TestEventsPagingUnderConcurrentInserts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(1)
	ctx := context.Background()
	setup, err := pgx.Connect(ctx, h.dsn)
	require.NoError(t, err)
	defer setup.Close(ctx)
	var before []string
	for i := range 150 {
		before = append(before, fmt.Sprintf("before-%03d", i))
	}
	require.NoError(t, insertEvents(ctx, setup, 1, before))

	const insertersN, transactionsPerInserter = 2, 40
	var inserted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, insertersN)
	for w := range insertersN {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, h.dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range transactionsPerInserter {
				tx, err := conn.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				var ids []string
				for j := range 1 + rng.IntN(4) {
					// Ids in no particular order relative to time.
					ids = append(ids, fmt.Sprintf("w%d-%c-%03d-%d", w, 'a'+rune(rng.IntN(26)), i, j))
				}
				if err := insertEvents(ctx, tx, 1, ids); err != nil {
					errs <- err
					return
				}
				time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond)
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
				inserted.Add(int64(len(ids)))
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	seen := map[string]int{}
	var order []string
	after := ""
	query := url.Values{"limit": {"7"}}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		// After the inserters are done, one last walk to the end.
		ids, next := h.pageAll("/v1/events", query, after, "event_id")
		after = next
		for _, id := range ids {
			seen[id]++
			order = append(order, id)
		}
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	rows, err := setup.Query(ctx, "SELECT event_id FROM payment_events")
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, all, len(before)+int(inserted.Load()))
	for _, id := range all {
		require.Equal(t, 1, seen[id], "event %s shown %d times", id, seen[id])
	}
	require.Len(t, seen, len(all), "nothing shown that is not stored")
	for _, id := range before {
		require.Contains(t, order[:len(before)], id, "rows older than the paging come first")
	}
}

// Filters, bounds, cursors and the answers' shapes.
func TestEventsPageFiltersAndBounds(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(1)
	h.createUser(2)
	for i := range 5 {
		require.Equal(t, http.StatusOK, h.postPayment(deposit(fmt.Sprintf("u1-dep-%d", i), 1, "1.50")).status)
		require.Equal(t, http.StatusOK, h.postPayment(deposit(fmt.Sprintf("u2-dep-%d", i), 2, "2")).status)
	}
	require.Equal(t, http.StatusOK, h.postPayment(paymentBody(map[string]string{
		"event_id": `"u1-wd"`, "event_type": `"withdrawal"`, "user_id": "1", "amount": `"0.5"`,
	})).status)
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'failed', outcome = 'dead_lettered' WHERE event_id IN ('u1-dep-3', 'u2-dep-4')`)

	ids := func(q url.Values) []string {
		got, _ := h.pageAll("/v1/events", q, "", "event_id")
		return got
	}
	require.ElementsMatch(t, []string{"u1-dep-0", "u1-dep-1", "u1-dep-2", "u1-dep-3", "u1-dep-4", "u1-wd"}, ids(url.Values{"user_id": {"1"}, "limit": {"2"}}))
	require.ElementsMatch(t, []string{"u1-dep-3", "u2-dep-4"}, ids(url.Values{"status": {"failed"}, "limit": {"1"}}))
	require.ElementsMatch(t, []string{"u1-wd"}, ids(url.Values{"type": {"withdrawal"}}))
	require.ElementsMatch(t, []string{"u1-dep-3"}, ids(url.Values{"user_id": {"1"}, "status": {"failed"}, "type": {"deposit"}}))
	require.Empty(t, ids(url.Values{"user_id": {"3"}}))
	require.Len(t, ids(url.Values{}), 11)

	// A page's events are what GET /v1/events/{id} shows; amounts are
	// decimal strings.
	_, p := h.page("/v1/events", url.Values{"user_id": {"1"}, "limit": {"1000"}})
	require.False(t, p.HasMore)
	require.Nil(t, p.Next, "the end of the list has no next")
	require.NotNil(t, p.Resume)
	for _, e := range p.Events {
		one := h.do(http.MethodGet, "/v1/events/"+fmt.Sprint(e["event_id"]), nil, bearer(apiToken))
		require.Equal(t, one.body, e)
	}
	require.Equal(t, "1.5", p.Events[0]["amount"])

	// The end of the list keeps its place in resume, and an empty page
	// from it gives it back: a reader polls from there for what comes
	// later.
	r, tail := h.page("/v1/events", url.Values{"after": {*p.Resume}, "user_id": {"1"}})
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, tail.Events)
	require.Nil(t, tail.Next)
	require.Equal(t, *p.Resume, *tail.Resume)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(r.raw, &raw))
	require.Equal(t, "[]", string(raw["events"]), "an empty list is [], not null")
	_, empty := h.page("/v1/events", url.Values{"user_id": {"3"}})
	require.Nil(t, empty.Next, "nothing read and no cursor given")
	require.Nil(t, empty.Resume, "nothing read and no cursor given")

	// The default limit is 100, the max 1000.
	for i := range 100 {
		require.Equal(t, http.StatusOK, h.postPayment(deposit(fmt.Sprintf("more-%03d", i), 2, "1")).status)
	}
	_, p = h.page("/v1/events", url.Values{})
	require.Len(t, p.Events, 100)
	require.True(t, p.HasMore)
	_, p = h.page("/v1/events", url.Values{"limit": {"1000"}})
	require.Len(t, p.Events, 111)

	journalCursor := httpapi.EncodeJournalCursor(postgres.JournalKey{XID: 1, ID: 1})
	for name, q := range map[string]url.Values{
		"limit 0":            {"limit": {"0"}},
		"limit over max":     {"limit": {"1001"}},
		"limit negative":     {"limit": {"-1"}},
		"limit not a number": {"limit": {"ten"}},
		"limit fraction":     {"limit": {"1.5"}},
		"limit twice":        {"limit": {"1", "2"}},
		"bad status":         {"status": {"done"}},
		"bad type":           {"type": {"gift"}},
		"bad user":           {"user_id": {"0"}},
		"cursor not base64":  {"after": {"%%%"}},
		"cursor garbage":     {"after": {"bm90IGEgY3Vyc29y"}},
		"journal cursor":     {"after": {journalCursor}},
		"cursor leading 0":   {"after": {base64.RawURLEncoding.EncodeToString([]byte("e1:01:x"))}},
		"cursor padded":      {"after": {base64.URLEncoding.EncodeToString([]byte("e1:1:xy"))}},
		"cursor empty id":    {"after": {base64.RawURLEncoding.EncodeToString([]byte("e1:1:"))}},
	} {
		r, _ := h.page("/v1/events", q)
		requireCode(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest)
		require.NotEmpty(t, r.body["error"], name)
	}

	requireCode(t, h.do(http.MethodGet, "/v1/events", nil, nil), http.StatusUnauthorized, httpapi.CodeUnauthorized)
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/v1/events", nil, bearer(adminToken)).status)
}

// A rare filter value reads a bounded number of rows per page: the page
// comes back short with has_more, and the next one finds the row.
func TestEventsPageScanIsBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(1)
	execSQL(t, h.dsn, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash)
		SELECT 'bulk-' || lpad(g::text, 6, '0'), 'deposit', 1, 'ETH', 1, sha256(convert_to(g::text, 'UTF8'))
		FROM generate_series(1, 10005) g`)
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'failed', outcome = 'dead_lettered' WHERE event_id = 'bulk-010004'`)

	r, first := h.page("/v1/events", url.Values{"status": {"failed"}})
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Empty(t, first.Events)
	require.True(t, first.HasMore)
	_, second := h.page("/v1/events", url.Values{"status": {"failed"}, "after": {*first.Next}})
	require.Len(t, second.Events, 1)
	require.Equal(t, "bulk-010004", second.Events[0]["event_id"])
	require.False(t, second.HasMore)
	require.Nil(t, second.Next)
}

// The journal pages the same way, per user, with an asset filter, while
// other connections write entries (some held open).
func TestJournalPaging(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	h.createUser(8)
	ctx := context.Background()
	journal := func(q execer, user int64, asset, amount, source string) error {
		_, err := q.Exec(ctx, `INSERT INTO balance_events (user_id, asset, amount, event_type, source_event_id)
			VALUES ($1, $2, $3::numeric, 'deposit', $4)`, user, asset, amount, source)
		return err
	}
	conn, err := pgx.Connect(ctx, h.dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, journal(conn, 7, "ETH", "1.25", "first"))
	require.NoError(t, journal(conn, 7, "USDC", "-0.5", "second"))
	require.NoError(t, journal(conn, 8, "ETH", "9", "other-user"))

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w, asset := range []string{"ETH", "USDC"} {
		wg.Go(func() {
			c, err := pgx.Connect(ctx, h.dsn)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(ctx)
			for i := range 30 {
				tx, err := c.Begin(ctx)
				if err == nil {
					err = journal(tx, 7, asset, "1", fmt.Sprintf("w%d-%d", w, i))
				}
				time.Sleep(time.Duration(i%5) * time.Millisecond)
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[string]int{}
	after := ""
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		ids, next := h.pageAll("/v1/users/7/journal", url.Values{"limit": {"4"}}, after, "source_event_id")
		after = next
		for _, id := range ids {
			seen[id]++
		}
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, seen, 62)
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
	require.NotContains(t, seen, "other-user")

	_, p := h.page("/v1/users/7/journal", url.Values{"asset": {"USDC"}, "limit": {"1"}})
	require.Len(t, p.Entries, 1)
	require.Equal(t, "second", p.Entries[0]["source_event_id"])
	require.Equal(t, "-0.5", p.Entries[0]["amount"])
	require.Equal(t, "USDC", p.Entries[0]["asset"])
	require.True(t, p.HasMore)
	usdc, _ := h.pageAll("/v1/users/7/journal", url.Values{"asset": {"USDC"}}, "", "asset")
	require.Len(t, usdc, 31)
	for _, a := range usdc {
		require.Equal(t, "USDC", a)
	}

	requireCode(t, h.do(http.MethodGet, "/v1/users/99/journal", nil, bearer(apiToken)), http.StatusNotFound, httpapi.CodeUnknownUser)
	requireCode(t, h.do(http.MethodGet, "/v1/users/7/journal?asset=DOGE", nil, bearer(apiToken)), http.StatusBadRequest, httpapi.CodeUnknownAsset)
	eventsCursor := httpapi.EncodeEventCursor(postgres.EventKey{XID: 1, EventID: "x"})
	requireCode(t, h.do(http.MethodGet, "/v1/users/7/journal?after="+eventsCursor, nil, bearer(apiToken)), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	requireCode(t, h.do(http.MethodGet, "/v1/users/7/journal?limit=1001", nil, bearer(apiToken)), http.StatusBadRequest, httpapi.CodeInvalidRequest)
	requireCode(t, h.do(http.MethodGet, "/v1/users/7/journal", nil, nil), http.StatusUnauthorized, httpapi.CodeUnauthorized)
}
