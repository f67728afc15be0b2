package chaos

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
)

// movesMoney: the event types a confirmation journals. A hold reserves
// and a void releases; neither writes a journal row.
func movesMoney(eventType string) bool {
	return eventType != "withdrawal_hold" && eventType != "withdrawal_void"
}

// holdModel is one hold as the provider's events and the api's answers
// make it: the hold event and every post or void that named it.
type holdModel struct {
	hold        *storedEvent   // nil if never stored
	sent        spec           // the hold as sent (zero if not sent)
	resolutions []*storedEvent // every post or void naming it
	confirmed   []*storedEvent // those confirmed
}

// held: the hold reserved money (its own event confirmed).
func (m *holdModel) held() bool { return m.hold != nil && m.hold.status == "confirmed" }

// holdSpan is when a hold was open, by its ledger transactions' start
// times; to is zero while it is open.
type holdSpan struct {
	amount   decimal.Decimal
	from, to time.Time
}

// heldMost is the most that holds can have reserved at a moment a
// transaction that started at decided read the balance: every hold open
// at any time within refusalSlack of it.
func heldMost(spans []holdSpan, decided time.Time) decimal.Decimal {
	sum := decimal.Zero
	for _, s := range spans {
		if !s.from.After(decided.Add(refusalSlack)) && (s.to.IsZero() || !s.to.Before(decided.Add(-refusalSlack))) {
			sum = sum.Add(s.amount)
		}
	}
	return sum
}

type holdRecord struct {
	user             int64
	asset, status    string
	amount           decimal.Decimal
	resolvedBy       string
	created, resolve time.Time
}

// verifyHolds holds the holds against the model: each resolved at most
// once, by its own user, and only if it held; every hold_closed and
// unknown_hold explained by what was sent; the holds table and the
// balances' held column as the confirmed resolutions say; invariant 4
// (SUM(open holds) <= balance). It returns when each (user, asset)'s
// holds were open, for the refusal check.
func verifyHolds(ctx context.Context, v *verdict, pool *pgxpool.Pool, stored map[string]*storedEvent, specs map[string]spec) map[balanceKey][]holdSpan {
	models := map[string]*holdModel{}
	model := func(id string) *holdModel {
		if models[id] == nil {
			models[id] = &holdModel{sent: specs[id]}
		}
		return models[id]
	}
	for _, e := range stored {
		if isChainUser(e.User) {
			continue
		}
		switch e.Type {
		case "withdrawal_hold":
			model(e.ID).hold = e
		case "withdrawal_post", "withdrawal_void":
			holdID := e.holdID
			if sent, ok := specs[e.ID]; ok {
				holdID = sent.HoldID
			}
			m := model(holdID)
			m.resolutions = append(m.resolutions, e)
			if e.status == "confirmed" {
				m.confirmed = append(m.confirmed, e)
			}
		}
	}
	records, err := loadHolds(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "holds: %v", err)
		return nil
	}
	ids := make([]string, 0, len(models))
	for id := range models {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	openHeld := map[balanceKey]decimal.Decimal{}
	counts := map[string]int{}
	for _, id := range ids {
		m := models[id]
		if len(m.confirmed) > 1 {
			v.fail("HOLD RESOLVED TWICE", "hold %s resolved by %s and %s", id, m.confirmed[0].ID, m.confirmed[1].ID)
			v.trace(id, m.confirmed[0].ID, m.confirmed[1].ID)
		}
		if len(m.confirmed) > 0 && !m.held() {
			v.fail("HOLD RESOLVED THAT NEVER HELD", "%s confirmed for hold %s, which is %s", m.confirmed[0].ID, id, holdState(m))
			v.trace(id, m.confirmed[0].ID)
		}
		for _, r := range m.confirmed {
			if m.held() && (r.User != m.sent.User || !decimal.RequireFromString(r.Amount).Equal(decimal.RequireFromString(m.sent.Amount))) {
				v.fail("HOLD RESOLVED BY ANOTHER USER OR FOR ANOTHER AMOUNT", "%s (user %d, %s) resolved hold %s (user %d, %s)", r.ID, r.User, r.Amount, id, m.sent.User, m.sent.Amount)
				v.trace(id, r.ID)
			}
		}
		for _, r := range m.resolutions {
			if r.status != "failed" {
				continue
			}
			switch r.outcome {
			case "hold_closed":
				// Only once another event resolved the hold.
				if !closedByOther(m, r.ID) {
					v.fail("HOLD_CLOSED UNEXPLAINED", "%s: hold %s is %s and no other post or void of it was confirmed", r.ID, id, holdState(m))
					v.trace(id, r.ID)
				}
			case "unknown_hold":
				// Only another user's post, or a hold that never held.
				if m.held() && r.User == m.sent.User {
					v.fail("UNKNOWN_HOLD UNEXPLAINED", "%s of user %d: hold %s is the same user's and held", r.ID, r.User, id)
					v.trace(id, r.ID)
				}
			}
		}
		if m.hold == nil {
			continue
		}
		counts[holdState(m)]++
		rec, ok := records[id]
		switch {
		case !m.held() && ok:
			v.fail("HOLDS TABLE DISAGREES", "hold %s is %s but has a holds row (%s)", id, holdState(m), rec.status)
		case !m.held():
		case !ok:
			v.fail("HOLDS TABLE DISAGREES", "hold %s held but has no holds row", id)
		default:
			want, by := "open", ""
			if len(m.confirmed) > 0 {
				want, by = "posted", m.confirmed[0].ID
				if m.confirmed[0].Type == "withdrawal_void" {
					want = "voided"
				}
			}
			if rec.status != want || rec.resolvedBy != by || rec.user != m.sent.User || rec.asset != m.sent.Asset || !rec.amount.Equal(decimal.RequireFromString(m.sent.Amount)) {
				v.fail("HOLDS TABLE DISAGREES", "hold %s: row %s by %q, user %d %s %s; the events say %s by %q, user %d %s %s",
					id, rec.status, rec.resolvedBy, rec.user, rec.amount, rec.asset, want, by, m.sent.User, m.sent.Amount, m.sent.Asset)
				v.trace(id)
			}
			if want == "open" {
				k := balanceKey{m.sent.User, m.sent.Asset}
				openHeld[k] = openHeld[k].Add(decimal.RequireFromString(m.sent.Amount))
			}
		}
	}
	spans := map[balanceKey][]holdSpan{}
	for id, rec := range records {
		if isChainUser(rec.user) {
			continue
		}
		if m := models[id]; m == nil || !m.held() {
			v.fail("HOLDS TABLE DISAGREES", "holds row %s (%s) for no held hold", id, rec.status)
		}
		k := balanceKey{rec.user, rec.asset}
		spans[k] = append(spans[k], holdSpan{amount: rec.amount, from: rec.created, to: rec.resolve})
	}
	v.note("holds: %v", counts)
	checkHeld(ctx, v, pool, openHeld)
	return spans
}

func closedByOther(m *holdModel, id string) bool {
	for _, c := range m.confirmed {
		if c.ID != id {
			return true
		}
	}
	return false
}

func holdState(m *holdModel) string {
	switch {
	case m.hold == nil:
		return "not stored"
	case !m.held():
		return m.hold.status + "/" + m.hold.outcome
	case len(m.confirmed) == 0:
		return "open"
	}
	return "resolved by " + m.confirmed[0].Type
}

// checkHeld: invariant 4 on the quiet books. Each balance's held column
// is the model's open holds and the holds table's, and within the
// balance.
func checkHeld(ctx context.Context, v *verdict, pool *pgxpool.Pool, model map[balanceKey]decimal.Decimal) {
	rows, err := pool.Query(ctx, `SELECT b.user_id, b.asset, b.balance::text, b.held::text, COALESCE(h.open, 0)::text
		FROM balances b FULL JOIN (SELECT user_id, asset, sum(amount) AS open FROM holds WHERE status = 'open' GROUP BY 1, 2) h
		USING (user_id, asset)`)
	if err != nil {
		v.fail("books unreadable", "held: %v", err)
		return
	}
	defer rows.Close()
	seen := map[balanceKey]bool{}
	for rows.Next() {
		var k balanceKey
		var balance, held, open *string
		if err := rows.Scan(&k.user, &k.asset, &balance, &held, &open); err != nil {
			v.fail("books unreadable", "held: %v", err)
			return
		}
		if isChainUser(k.user) {
			continue
		}
		seen[k] = true
		d := func(s *string) decimal.Decimal {
			if s == nil {
				return decimal.Zero
			}
			return decimal.RequireFromString(*s)
		}
		b, h, o, want := d(balance), d(held), d(open), model[k]
		if balance == nil || !h.Equal(o) || o.GreaterThan(b) || !o.Equal(want) {
			v.fail("INVARIANT 4 (HELD) WRONG", "user %d %s: balance %s, held column %s, open holds %s; the events leave %s open",
				k.user, k.asset, strOrNone(balance), h, o, want)
		}
	}
	if err := rows.Err(); err != nil {
		v.fail("books unreadable", "held: %v", err)
	}
	for k, want := range model {
		if !seen[k] && !want.IsZero() {
			v.fail("INVARIANT 4 (HELD) WRONG", "user %d %s: no balance row; the events leave %s open", k.user, k.asset, want)
		}
	}
}

func strOrNone(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}

func loadHolds(ctx context.Context, pool *pgxpool.Pool) (map[string]holdRecord, error) {
	rows, err := pool.Query(ctx, `SELECT hold_id, user_id, asset, amount::text, status, COALESCE(resolved_by, ''), created_at, resolved_at FROM holds`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]holdRecord{}
	for rows.Next() {
		var id, amount string
		var r holdRecord
		var resolved *time.Time
		if err := rows.Scan(&id, &r.user, &r.asset, &amount, &r.status, &r.resolvedBy, &r.created, &resolved); err != nil {
			return nil, err
		}
		r.amount = decimal.RequireFromString(amount)
		if resolved != nil {
			r.resolve = *resolved
		}
		out[id] = r
	}
	return out, rows.Err()
}

// heldSampleLimit bounds the rows one run-time sample reports.
const heldSampleLimit = 5

// sampleHeld is invariant 4 while the soak runs, in one statement (one
// snapshot): no balance's open holds exceed it, and its held column is
// their sum.
func (w *balanceWatch) sampleHeld(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `SELECT b.user_id, b.asset, b.balance::text, b.held::text, COALESCE(h.open, 0)::text
		FROM balances b LEFT JOIN (SELECT user_id, asset, sum(amount) AS open FROM holds WHERE status = 'open' GROUP BY 1, 2) h
		USING (user_id, asset)
		WHERE b.held <> COALESCE(h.open, 0) OR COALESCE(h.open, 0) > b.balance LIMIT $1`, heldSampleLimit)
	if err != nil {
		return
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var user int64
		var asset, balance, held, open string
		if rows.Scan(&user, &asset, &balance, &held, &open) == nil {
			found = append(found, fmt.Sprintf("user %d %s at %s: balance %s, held column %s, open holds %s", user, asset, time.Now().Format("15:04:05.000"), balance, held, open))
		}
	}
	if rows.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.heldChecks++
	w.heldFound += len(found)
	for _, f := range found {
		if len(w.heldSamples) < findingSamples {
			w.heldSamples = append(w.heldSamples, f)
		}
	}
}

func (w *balanceWatch) reportHeld(v *verdict) {
	for _, s := range w.heldSamples {
		v.fail("INVARIANT 4 (HELD) WRONG DURING THE RUN", "%s", s)
	}
	if w.heldFound > len(w.heldSamples) {
		v.count["INVARIANT 4 (HELD) WRONG DURING THE RUN"] += w.heldFound - len(w.heldSamples)
	}
	v.note("holds within balances sampled %d times during the run", w.heldChecks)
}

// TestHeldMost: a refusal is held against every hold open at any moment
// within refusalSlack of its transaction's start, the kindest reading.
func TestHeldMost(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := decimal.RequireFromString
	spans := []holdSpan{
		{d("1"), t0.Add(-time.Hour), t0.Add(-time.Hour + time.Second)}, // closed long before
		{d("2"), t0.Add(-time.Hour), t0.Add(-time.Second)},             // closed within the slack
		{d("4"), t0.Add(-time.Hour), time.Time{}},                      // still open
		{d("8"), t0.Add(refusalSlack / 2), t0.Add(refusalSlack)},       // opened within the slack
		{d("16"), t0.Add(2 * refusalSlack), time.Time{}},               // opened long after
	}
	if got := heldMost(spans, t0); !got.Equal(d("14")) {
		t.Fatalf("heldMost = %s, want 2+4+8 = 14", got)
	}
	if got := heldMost(nil, t0); !got.IsZero() {
		t.Fatalf("no holds: %s, want 0", got)
	}
}
