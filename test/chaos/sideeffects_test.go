package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/test/harness"
)

// Notification receiver and DLQ replay bounds.
const (
	// notifySecret is NOTIFY_WEBHOOK_SECRET (≥ 32 characters, literal).
	notifySecret = "chaos-soak-notification-secret-0123456789"
	// receiverFailPct of the deliveries are answered 503, so retries with
	// backoff are part of the run.
	receiverFailPct  = 5
	notifyBodyMax    = 1 << 16
	notifyDrainMax   = 3 * time.Minute
	notifyDrainPoll  = time.Second
	replayEvery      = 7 * time.Second
	replayPageMax    = 100
	replayRequestMax = 10 * time.Second
)

// receiver is NOTIFY_WEBHOOK_URL: it checks each delivery's signature and
// records, per delivery id, how often it was delivered and its payload.
type receiver struct {
	srv *httptest.Server
	key []byte

	mu        sync.Mutex
	rng       *rand.Rand
	delivered map[string]int
	payloads  map[string]notifyPayload
	refused   int
	bad       []string
}

type notifyPayload struct {
	DeliveryID string `json:"delivery_id"`
	Kind       string `json:"kind"`
	EventID    string `json:"event_id"`
	UserID     int64  `json:"user_id"`
	Asset      string `json:"asset"`
	Amount     string `json:"amount"`
}

func startReceiver(t *testing.T, seed uint64) *receiver {
	key, err := notify.ParseSecret(notifySecret)
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{key: key, rng: rand.New(rand.NewPCG(seed, 0x4071f)), delivered: map[string]int{}, payloads: map[string]notifyPayload{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, notifyBodyMax))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	id, ts := req.Header.Get(notify.HeaderID), req.Header.Get(notify.HeaderTimestamp)
	unix, err := strconv.ParseInt(ts, 10, 64)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || req.Header.Get(notify.HeaderSignature) != notify.Sign(r.key, id, time.Unix(unix, 0), body) {
		r.badLocked("delivery %q: signature does not verify", id)
		http.Error(w, "signature", http.StatusUnauthorized)
		return
	}
	var p notifyPayload
	if err := json.Unmarshal(body, &p); err != nil || p.DeliveryID != id {
		r.badLocked("delivery %q: payload %q", id, body)
		http.Error(w, "payload", http.StatusBadRequest)
		return
	}
	if r.rng.IntN(100) < receiverFailPct {
		r.refused++
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	if old, ok := r.payloads[id]; ok && old != p {
		r.badLocked("delivery %q delivered with two payloads: %+v then %+v", id, old, p)
	}
	r.delivered[id]++
	r.payloads[id] = p
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) badLocked(format string, args ...any) {
	if len(r.bad) < findingSamples {
		r.bad = append(r.bad, fmt.Sprintf(format, args...))
	}
}

// settings point the workers' deliverer at the receiver.
func (r *receiver) settings(m map[string]string) {
	m["NOTIFY_WEBHOOK_URL"] = r.srv.URL + "/notify"
	m["NOTIFY_WEBHOOK_SECRET"] = notifySecret
	m["NOTIFY_INTERVAL"] = "1s"
}

// waitNotified waits, bounded, until the outbox holds nothing pending.
func waitNotified(ctx context.Context, c *cluster, pool *pgxpool.Pool) error {
	deadline := time.Now().Add(notifyDrainMax)
	for {
		var pending int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.QueryRow(qctx, `SELECT count(*) FROM notification_outbox WHERE status = 'pending'`).Scan(&pending)
		cancel()
		if err == nil && pending == 0 {
			c.timeline.add("every notification delivered or given up")
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("after %s, the outbox is still unreadable: %w", notifyDrainMax, err)
			}
			return fmt.Errorf("after %s, %d notifications still pending", notifyDrainMax, pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(notifyDrainPoll):
		}
	}
}

// expectedNotification is the delivery id an event's end calls for, from
// what the verifier already holds against the model: a credited deposit,
// a confirmed withdrawal, a posted or voided hold, a refusal for
// insufficient funds (a hold's too), a reversal.
func expectedNotification(e *storedEvent) (string, bool) {
	switch {
	case e.status == "confirmed" && e.Type == "reorg_compensation":
		return "deposit_reversed:" + e.ID, true
	case e.status == "confirmed" && e.credit():
		return "deposit_credited:" + e.ID, true
	case e.status == "confirmed" && e.Type == "withdrawal_hold":
		return "", false // a reservation tells the user nothing yet
	case e.status == "confirmed" && e.Type == "withdrawal_post":
		return "withdrawal_posted:" + e.ID, true
	case e.status == "confirmed" && e.Type == "withdrawal_void":
		return "hold_voided:" + e.ID, true
	case e.status == "confirmed":
		return "withdrawal_confirmed:" + e.ID, true
	case e.status == "failed" && e.outcome == "insufficient_funds":
		return "insufficient_funds:" + e.ID, true
	}
	return "", false
}

// verifyNotifications: every event that called for a notification got
// its delivery id at least once (more is at-least-once), with the
// event's own user, asset and amount; no delivery for anything else; no
// bad signature; nothing left failed in the outbox.
func verifyNotifications(ctx context.Context, v *verdict, pool *pgxpool.Pool, r *receiver) {
	stored, err := loadEvents(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "%v", err)
		return
	}
	r.mu.Lock()
	delivered := make(map[string]int, len(r.delivered))
	for k, n := range r.delivered {
		delivered[k] = n
	}
	payloads := make(map[string]notifyPayload, len(r.payloads))
	for k, p := range r.payloads {
		payloads[k] = p
	}
	bad, refused := append([]string(nil), r.bad...), r.refused
	r.mu.Unlock()
	for _, b := range bad {
		v.fail("notifications: malformed or unsigned delivery", "%s", b)
	}
	expected := map[string]*storedEvent{}
	for _, e := range stored {
		if id, ok := expectedNotification(e); ok {
			expected[id] = e
		}
	}
	ids := make([]string, 0, len(expected))
	for id := range expected {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	dups := 0
	for _, id := range ids {
		e := expected[id]
		n := delivered[id]
		if n == 0 {
			v.fail("notifications: MISSING (an event's end never notified)", "%s (event %s/%s, user %d %s %s)", id, e.status, e.outcome, e.User, e.Amount, e.Asset)
			continue
		}
		dups += n - 1
		p := payloads[id]
		if p.EventID != e.ID || p.UserID != e.User || p.Asset != e.Asset || !decimal.RequireFromString(p.Amount).Equal(decimal.RequireFromString(e.Amount)) {
			v.fail("notifications: payload differs from the event", "%s: %+v; event %s user %d %s %s", id, p, e.ID, e.User, e.Amount, e.Asset)
		}
	}
	for id := range delivered {
		if _, ok := expected[id]; !ok {
			v.fail("notifications: DELIVERED FOR NO SUCH END", "%s (%+v)", id, payloads[id])
		}
	}
	var failed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM notification_outbox WHERE status <> 'delivered'`).Scan(&failed); err != nil {
		v.fail("books unreadable", "notification_outbox: %v", err)
	} else if failed > 0 {
		v.fail("notifications: outbox rows not delivered", "%d rows pending or failed", failed)
	}
	v.note("notifications: %d expected, %d delivery ids received (%d redelivered by id, at least once), %d answered 503 on purpose",
		len(expected), len(delivered), dups, refused)
}

// replayer plays the operator: it replays every open dead letter during
// the run, through the admin API, and remembers what each replay said.
type replayer struct {
	client *harness.Client

	mu      sync.Mutex
	results map[int64]string // dead letter id → replay result
	events  map[int64]string // dead letter id → event id
	errors  map[string]int
}

func newReplayer(apiURL string) *replayer {
	c := harness.NewClient(apiURL)
	c.HTTP = &http.Client{Timeout: replayRequestMax}
	return &replayer{client: c, results: map[int64]string{}, events: map[int64]string{}, errors: map[string]int{}}
}

func (p *replayer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(replayEvery):
		}
		p.once()
	}
}

// once replays what is open now; errors (the api down on purpose) are
// counted and the next round tries again.
func (p *replayer) once() {
	status, body, err := p.client.Admin(http.MethodGet, fmt.Sprintf("/admin/dlq?state=open&limit=%d", replayPageMax), nil)
	if err != nil || status != http.StatusOK {
		p.count(fmt.Sprintf("list: %d %v", status, errorClassOrNil(err)))
		return
	}
	entries, _ := body["entries"].([]any)
	for _, raw := range entries {
		entry, _ := raw.(map[string]any)
		idf, _ := entry["id"].(float64)
		eventID, _ := entry["event_id"].(string)
		id := int64(idf)
		status, answer, err := p.client.Admin(http.MethodPost, fmt.Sprintf("/admin/dlq/%d/replay", id), map[string]any{"reason": "chaos soak replays every dead letter", "operator": "chaos"})
		if err != nil || status != http.StatusOK {
			p.count(fmt.Sprintf("replay: %d %v", status, errorClassOrNil(err)))
			continue
		}
		result, _ := answer["result"].(string)
		p.mu.Lock()
		if _, seen := p.results[id]; !seen || result != "already_replayed" {
			p.results[id] = result
		}
		p.events[id] = eventID
		p.mu.Unlock()
	}
}

func errorClassOrNil(err error) string {
	if err == nil {
		return ""
	}
	return errorClass(err)
}

func (p *replayer) count(why string) {
	p.mu.Lock()
	p.errors[why]++
	p.mu.Unlock()
}

// verifyReplays: each replayed event ended terminal, moved money at most
// once (one journal row if confirmed, none if failed), and its entry is
// closed as replayed. The model's checks (verify, verifyChain) already
// count its credit or debit once among the others.
func verifyReplays(ctx context.Context, v *verdict, pool *pgxpool.Pool, p *replayer) {
	stored, err := loadEvents(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "%v", err)
		return
	}
	resolutions := map[int64]string{}
	rows, err := pool.Query(ctx, `SELECT id, COALESCE(resolution, '') FROM dead_letter_queue`)
	if err != nil {
		v.fail("books unreadable", "dead letters: %v", err)
		return
	}
	for rows.Next() {
		var id int64
		var res string
		if rows.Scan(&id, &res) == nil {
			resolutions[id] = res
		}
	}
	rows.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	results := map[string]int{}
	for id, result := range p.results {
		results[result]++
		eventID := p.events[id]
		e, ok := stored[eventID]
		switch {
		case !ok:
			v.fail("DLQ REPLAY: replayed event not stored", "dead letter %d names %q", id, eventID)
			continue
		case e.status != "confirmed" && e.status != "failed":
			v.fail("DLQ REPLAY: replayed event not terminal", "dead letter %d: %s is %s", id, eventID, e.status)
		case e.status == "confirmed" && e.journalRows != 1, e.status == "failed" && e.journalRows != 0:
			v.fail("DLQ REPLAY: replayed event moved money other than once", "dead letter %d: %s %s/%s with %d journal rows", id, eventID, e.status, e.outcome, e.journalRows)
		}
		if resolutions[id] != "replayed" {
			v.fail("DLQ REPLAY: entry not closed as replayed", "dead letter %d (%s): resolution %q after a %s replay", id, eventID, resolutions[id], result)
		}
	}
	var parts []string
	for _, k := range sortedKeys(p.errors) {
		parts = append(parts, fmt.Sprintf("[%s]=%d", k, p.errors[k]))
	}
	v.note("dlq replays: %d dead letters replayed during the run %v; admin calls that failed: %s", len(p.results), results, strings.Join(parts, " "))
}
