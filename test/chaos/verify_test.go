package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/postgres"
)

// dlqSlack is how long after a fault on the workers' path to PostgreSQL
// a task may still run out of retries because of it: the whole retry
// budget of the soak's settings plus a task timeout.
const dlqSlack = 90 * time.Second

// storedEvent is a payment_events row with what the ledger did for it.
type storedEvent struct {
	spec
	status, outcome string
	retries, gen    int
	journalRows     int
	journalSum      decimal.Decimal
	txHash          string
	holdID          string // a post's or void's
	created         time.Time
	key             string // processed_events outcome, "" if none
	dlq             []dlqRow
}

type dlqRow struct {
	id             int64
	eventID        string
	source, reason string
	created        time.Time
}

// verdict is the end-of-run account: findings fail the soak; notes are
// what happened and is allowed. Findings are grouped by kind, a few
// samples each, so that a systematic bug reads as one line, not thousands.
type verdict struct {
	kinds   []string
	count   map[string]int
	samples map[string][]string
	notes   []string
	report  string // the invariant checker's
	// traces are event ids and transaction hashes whose process log
	// lines the failure report shows.
	traces []string
}

// trace asks the failure report for the log lines naming each subject.
func (v *verdict) trace(subjects ...string) {
	for _, s := range subjects {
		if s != "" && !slices.Contains(v.traces, s) {
			v.traces = append(v.traces, s)
		}
	}
}

// findingSamples bounds the examples kept per kind of finding.
const findingSamples = 5

func (v *verdict) fail(kind, format string, args ...any) {
	if v.count == nil {
		v.count, v.samples = map[string]int{}, map[string][]string{}
	}
	if v.count[kind] == 0 {
		v.kinds = append(v.kinds, kind)
	}
	v.count[kind]++
	if len(v.samples[kind]) < findingSamples {
		v.samples[kind] = append(v.samples[kind], fmt.Sprintf(format, args...))
	}
}

func (v *verdict) note(format string, args ...any) {
	v.notes = append(v.notes, fmt.Sprintf(format, args...))
}

// findings is one line per kind: its count and its samples.
func (v *verdict) findings() []string {
	var out []string
	for _, kind := range v.kinds {
		line := fmt.Sprintf("%s: %d", kind, v.count[kind])
		for _, s := range v.samples[kind] {
			line += "\n    " + s
		}
		if more := v.count[kind] - len(v.samples[kind]); more > 0 {
			line += fmt.Sprintf("\n    ... and %d more", more)
		}
		out = append(out, line)
	}
	return out
}

// verify compares the books with what the provider was told, on a
// quiet system (every process stopped). The chain's users are
// verifyChain's.
func verify(ctx context.Context, db *postgres.DB, pool *pgxpool.Pool, s *sender, initial map[balanceKey]decimal.Decimal, windows []window) *verdict {
	v := &verdict{}
	report, err := invariant.Check(ctx, db, invariant.Quiet())
	if err != nil {
		v.fail("invariant check failed to run", "%v", err)
	} else {
		v.report = report.String()
		if !report.OK() {
			v.fail("INVARIANTS VIOLATED", "see the invariant report")
		}
	}
	stored, err := loadEvents(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "%v", err)
		return v
	}

	s.mu.Lock()
	specs := map[string]spec{}
	for _, e := range s.events {
		specs[e.ID] = e
	}
	acked := map[string]bool{}
	for id := range s.acked {
		acked[id] = true
	}
	anomalies, anomalous, undelivered := append([]string(nil), s.anomalies...), s.anomalous, append([]string(nil), s.undeliv...)
	s.mu.Unlock()

	for _, a := range anomalies {
		v.fail("api answers the contract forbids", "%s", a)
	}
	if anomalous > len(anomalies) {
		// The sender kept samples only; count the rest.
		v.count["api answers the contract forbids"] += anomalous - len(anomalies)
	}
	for _, u := range undelivered {
		v.fail("webhooks never answered", "no definitive answer within %s: %s", deliveryMax, u)
	}

	// Nothing lost: every acknowledged event is stored, as sent, and done.
	ackedIDs := make([]string, 0, len(acked))
	for id := range acked {
		ackedIDs = append(ackedIDs, id)
	}
	sort.Strings(ackedIDs)
	for _, id := range ackedIDs {
		e, ok := stored[id]
		if !ok {
			v.fail("LOST (acknowledged with 200, not stored)", "%s", id)
			continue
		}
		want := specs[id]
		if e.Type != want.Type || e.User != want.User || e.Asset != want.Asset || e.holdID != want.HoldID || !decimal.RequireFromString(e.Amount).Equal(decimal.RequireFromString(want.Amount)) {
			v.fail("stored content differs from what was sent", "%s stored as %+v, sent as %+v", id, e.spec, want)
		}
		if e.status != "confirmed" && e.status != "failed" {
			v.fail("NOT SETTLED", "%s is still %s (retries %d, generation %d)", id, e.status, e.retries, e.gen)
		}
	}

	expected := map[balanceKey]decimal.Decimal{}
	for k, amount := range initial {
		expected[k] = amount
	}
	outcomes := map[string]int{}
	var justified []string
	ids := make([]string, 0, len(stored))
	for id := range stored {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		e := stored[id]
		if isChainUser(e.User) {
			continue
		}
		if !acked[id] {
			v.fail("stored without a 200 to the provider", "%s", id)
			continue
		}
		amount := decimal.RequireFromString(e.Amount)
		signed := amount
		if !e.credit() {
			signed = amount.Neg()
		}
		outcomes[e.status+"/"+e.outcome]++
		switch e.status {
		case "confirmed":
			wantKey := "success"
			if e.Type == "withdrawal_hold" {
				wantKey = "held"
			}
			if (wantKey == "held" && e.outcome != wantKey) || e.key != wantKey {
				v.fail("idempotency record disagrees with the outcome", "%s confirmed with outcome %q, record %q (want %q)", id, e.outcome, e.key, wantKey)
			}
			if !movesMoney(e.Type) {
				// A hold reserves and a void releases: no journal row.
				if e.journalRows != 0 {
					v.fail("DOUBLE OR MISSING MONEY MOVEMENT", "%s (%s) confirmed with %d journal rows (want none)", id, e.Type, e.journalRows)
				}
				break
			}
			// Nothing doubled: one journal row, for the event's amount
			// (a post's: minus its hold's).
			if e.journalRows != 1 || !e.journalSum.Equal(signed) {
				v.fail("DOUBLE OR MISSING MONEY MOVEMENT", "%s confirmed with %d journal rows summing %s (want one of %s)", id, e.journalRows, e.journalSum, signed)
			}
			k := balanceKey{e.User, e.Asset}
			expected[k] = expected[k].Add(signed)
		case "failed":
			if e.journalRows != 0 {
				v.fail("DOUBLE OR MISSING MONEY MOVEMENT", "%s failed but has %d journal rows", id, e.journalRows)
			}
			switch e.outcome {
			case "insufficient_funds":
				if e.credit() {
					v.fail("credit failed for insufficient funds", "%s (%s)", id, e.Type)
				}
				if e.key != "insufficient_funds" {
					v.fail("idempotency record disagrees with the outcome", "%s failed for insufficient funds, record %q", id, e.key)
				}
			case "dead_lettered":
				if len(e.dlq) == 0 {
					v.fail("dead-lettered without a DLQ row", "%s", id)
				}
			case "hold_closed", "unknown_hold":
				// Explained hold by hold in verifyHolds.
				if e.Type != "withdrawal_post" && e.Type != "withdrawal_void" {
					v.fail("failed with an outcome no fault here can cause", "%s (%s): %q", id, e.Type, e.outcome)
				}
				if e.key != e.outcome {
					v.fail("idempotency record disagrees with the outcome", "%s failed %s, record %q", id, e.outcome, e.key)
				}
			default:
				v.fail("failed with an outcome no fault here can cause", "%s: %q", id, e.outcome)
			}
		}
		// Every DLQ row must be explained by a fault.
		for _, d := range e.dlq {
			if why, ok := explain(d, windows, e.created); ok {
				justified = append(justified, fmt.Sprintf("dlq %d %s (%s, event now %s): %s; %s", d.id, d.eventID, d.source, e.status, d.reason, why))
			} else {
				v.fail("UNEXPLAINED DEAD LETTERS", "row %d for %s (source %s, at %s, event now %s/%s): %s",
					d.id, d.eventID, d.source, d.created.Format("15:04:05.000"), e.status, e.outcome, d.reason)
			}
		}
	}
	for _, j := range justified {
		v.note("justified: %s", j)
	}
	v.note("outcomes: %v", outcomes)

	// The balances, recomputed from what the provider sent.
	balances, err := loadBalances(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "balances: %v", err)
		return v
	}
	for k, want := range expected {
		if got := balances[k]; !got.Equal(want) {
			v.fail("BALANCE WRONG", "user %d %s is %s; the provider's events say %s", k.user, k.asset, got, want)
		}
	}
	for k, got := range balances {
		if _, ok := expected[k]; !ok && !got.IsZero() && !isChainUser(k.user) {
			v.fail("BALANCE WRONG", "user %d %s is %s; no event touched it", k.user, k.asset, got)
		}
	}
	open := verifyHolds(ctx, v, pool, stored, specs)
	checkRefusals(ctx, v, pool, initial, open)
	if orphans, err := orphanDLQ(ctx, pool, stored); err != nil {
		v.fail("books unreadable", "dead letters: %v", err)
	} else {
		for _, d := range orphans {
			v.fail("UNEXPLAINED DEAD LETTERS", "row %d names no stored event %q (source %s): %s", d.id, d.eventID, d.source, d.reason)
		}
	}
	return v
}

// explain accepts a dead letter only as the retry budget of a task that
// ran out while PostgreSQL was unreachable for the workers: the fault
// began before the dead letter, ended no earlier than the event was
// accepted (it overlapped the event's own attempts), and no longer ago
// than a retry budget.
func explain(d dlqRow, windows []window, eventCreated time.Time) (string, bool) {
	if !strings.Contains(d.reason, "retries exhausted") {
		return "", false
	}
	for _, w := range windows {
		if !cutsWorkersFromPostgres(w.fault) {
			continue
		}
		if overlapsAttempts(w, d, eventCreated) {
			return fmt.Sprintf("retry budget spent during %v (%s–%s)", w.fault, w.from.Format("15:04:05.000"), w.to.Format("15:04:05.000")), true
		}
	}
	return "", false
}

// overlapsAttempts: the fault window touches the event's life up to the
// dead letter, and the dead letter came within a retry budget of it.
func overlapsAttempts(w window, d dlqRow, eventCreated time.Time) bool {
	return !d.created.Before(w.from) && d.created.Before(w.to.Add(dlqSlack)) && !w.to.Before(eventCreated)
}

func cutsWorkersFromPostgres(f fault) bool {
	switch f.Kind {
	case pgRestart, pgKill, pgPause:
		return true
	case linkLatency, linkBlackhole, linkReset:
		return f.Target == "workers→pg" || f.Target == "*→pg"
	}
	return false
}

func loadEvents(ctx context.Context, pool *pgxpool.Pool) (map[string]*storedEvent, error) {
	out := map[string]*storedEvent{}
	rows, err := pool.Query(ctx, `SELECT event_id, event_type, user_id, asset, amount::text, status, COALESCE(outcome, ''), retry_count, generation, COALESCE(tx_hash, ''), COALESCE(hold_id, ''), created_at FROM payment_events`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		e := &storedEvent{}
		if err := rows.Scan(&e.ID, &e.Type, &e.User, &e.Asset, &e.Amount, &e.status, &e.outcome, &e.retries, &e.gen, &e.txHash, &e.holdID, &e.created); err != nil {
			rows.Close()
			return nil, err
		}
		out[e.ID] = e
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = pool.Query(ctx, `SELECT source_event_id, count(*), sum(amount)::text FROM balance_events GROUP BY source_event_id`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, sum string
		var n int
		if err := rows.Scan(&id, &n, &sum); err != nil {
			rows.Close()
			return nil, err
		}
		if e, ok := out[id]; ok {
			e.journalRows, e.journalSum = n, decimal.RequireFromString(sum)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = pool.Query(ctx, `SELECT event_id, outcome FROM processed_events`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, outcome string
		if err := rows.Scan(&id, &outcome); err != nil {
			rows.Close()
			return nil, err
		}
		if e, ok := out[id]; ok {
			e.key = outcome
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	dlq, err := loadDLQ(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, d := range dlq {
		if e, ok := out[d.eventID]; ok {
			e.dlq = append(e.dlq, d)
		}
	}
	return out, nil
}

func loadDLQ(ctx context.Context, pool *pgxpool.Pool) ([]dlqRow, error) {
	rows, err := pool.Query(ctx, `SELECT id, event_id, source, error, created_at FROM dead_letter_queue ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []dlqRow
	for rows.Next() {
		var d dlqRow
		if err := rows.Scan(&d.id, &d.eventID, &d.source, &d.reason, &d.created); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

func orphanDLQ(ctx context.Context, pool *pgxpool.Pool, stored map[string]*storedEvent) ([]dlqRow, error) {
	all, err := loadDLQ(ctx, pool)
	if err != nil {
		return nil, err
	}
	var out []dlqRow
	for _, d := range all {
		if _, ok := stored[d.eventID]; !ok {
			out = append(out, d)
		}
	}
	return out, nil
}

type balanceKey struct {
	user  int64
	asset string
}

func loadBalances(ctx context.Context, pool *pgxpool.Pool) (map[balanceKey]decimal.Decimal, error) {
	rows, err := pool.Query(ctx, `SELECT user_id, asset, balance::text FROM balances`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[balanceKey]decimal.Decimal{}
	for rows.Next() {
		var k balanceKey
		var text string
		if err := rows.Scan(&k.user, &k.asset, &text); err != nil {
			return nil, err
		}
		out[k] = decimal.RequireFromString(text)
	}
	return out, rows.Err()
}

// refusalSlack bounds how far a ledger transaction's start (its now(),
// which its journal rows and its events' updated_at carry) may lie from
// the moment it read a balance: lock waits, statement timeouts and a
// paused PostgreSQL, with room to spare.
const refusalSlack = 30 * time.Second

type journalRow struct {
	amount  decimal.Decimal
	created time.Time
}

// checkRefusals holds every withdrawal refused for insufficient funds
// against the journal: replayed in commit order (the ledger writes a
// balance's rows while it holds the balance's lock, so their ids are in
// commit order), the balance must have been short at some point the
// refusal could have been decided. That point is inside the refusing
// transaction's own rows if it wrote any for that balance (its debits
// before, its credits after: the kindest order), else anywhere within
// refusalSlack of its start. A ledger that refuses what it could pay is
// caught; a ledger that pays what it cannot is caught by the balances.
//
// With holds the refusal is of available money, balance less open holds:
// the journal's lowest balance less every hold open at any moment of the
// same window (heldMost) is a lower bound of what was available, so the
// check stays exact for a user without holds and kind for one with them.
// A refused hold is held against it the same way.
func checkRefusals(ctx context.Context, v *verdict, pool *pgxpool.Pool, initial map[balanceKey]decimal.Decimal, holds map[balanceKey][]holdSpan) {
	journal := map[balanceKey][]journalRow{}
	rows, err := pool.Query(ctx, `SELECT user_id, asset, amount::text, created_at FROM balance_events ORDER BY id`)
	if err != nil {
		v.fail("books unreadable", "journal: %v", err)
		return
	}
	for rows.Next() {
		var k balanceKey
		var amount string
		var r journalRow
		if err := rows.Scan(&k.user, &k.asset, &amount, &r.created); err != nil {
			rows.Close()
			v.fail("books unreadable", "journal: %v", err)
			return
		}
		r.amount = decimal.RequireFromString(amount)
		journal[k] = append(journal[k], r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		v.fail("books unreadable", "journal: %v", err)
		return
	}
	rows, err = pool.Query(ctx, `SELECT event_id, user_id, asset, amount::text, updated_at FROM payment_events
		WHERE status = 'failed' AND outcome = 'insufficient_funds' ORDER BY event_id`)
	if err != nil {
		v.fail("books unreadable", "refusals: %v", err)
		return
	}
	defer rows.Close()
	checked := 0
	for rows.Next() {
		var id, amount string
		var k balanceKey
		var decided time.Time
		if err := rows.Scan(&id, &k.user, &k.asset, &amount, &decided); err != nil {
			v.fail("books unreadable", "refusals: %v", err)
			return
		}
		if isChainUser(k.user) {
			continue
		}
		checked++
		want := decimal.RequireFromString(amount)
		low := lowestBalance(initial[k], journal[k], decided)
		held := heldMost(holds[k], decided)
		if avail := low.Sub(held); !avail.LessThan(want) {
			v.fail("WITHDRAWAL REFUSED THOUGH THE BALANCE COVERED IT", "%s: %s %s refused for user %d at %s; the journal never shows the balance below %s then, nor holds above %s (available at least %s)",
				id, want, k.asset, k.user, decided.Format("15:04:05.000000"), low, held, avail)
		}
	}
	if err := rows.Err(); err != nil {
		v.fail("books unreadable", "refusals: %v", err)
		return
	}
	v.note("refusals checked against the journal: %d", checked)
}

// lowestBalance is the lowest the balance can have been when a
// transaction that started at decided read it.
func lowestBalance(initial decimal.Decimal, rows []journalRow, decided time.Time) decimal.Decimal {
	prefix := make([]decimal.Decimal, len(rows)+1)
	prefix[0] = initial
	for i, r := range rows {
		prefix[i+1] = prefix[i].Add(r.amount)
	}
	first, last := -1, -1
	for i, r := range rows {
		if r.created.Equal(decided) {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first >= 0 {
		low := prefix[first]
		for _, r := range rows[first : last+1] {
			if r.created.Equal(decided) && r.amount.IsNegative() {
				low = low.Add(r.amount)
			}
		}
		return low
	}
	lo, hi := 0, len(rows)
	for i, r := range rows {
		if r.created.Before(decided.Add(-refusalSlack)) {
			lo = i + 1
		}
		if r.created.After(decided.Add(refusalSlack)) && hi == len(rows) {
			hi = i
		}
	}
	if hi < lo {
		hi = lo
	}
	low := prefix[lo]
	for k := lo; k <= hi; k++ {
		low = decimal.Min(low, prefix[k])
	}
	return low
}

// TestLowestBalance: a refusal is judged at the kindest point the
// journal allows: inside the refusing transaction's own rows (debits
// first), else anywhere within refusalSlack of its start.
func TestLowestBalance(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := decimal.RequireFromString
	rows := []journalRow{
		{d("5"), t0.Add(-time.Hour)},                    // certainly before
		{d("-4"), t0.Add(-time.Second)},                 // maybe before
		{d("3"), t0},                                    // the refusing transaction's credit
		{d("-2"), t0},                                   // and its debit
		{d("10"), t0.Add(time.Hour)},                    // certainly after
		{d("-100"), t0.Add(time.Hour + time.Second)},    // certainly after
		{d("1"), t0.Add(2*time.Hour + refusalSlack*10)}, // far after
	}
	if got := lowestBalance(d("1"), rows, t0); !got.Equal(d("0")) {
		t.Fatalf("inside its own rows: %s, want 1+5-4-2 = 0", got)
	}
	if got := lowestBalance(d("1"), rows, t0.Add(time.Millisecond)); !got.Equal(d("2")) {
		t.Fatalf("no rows of its own: %s, want the lowest within the slack, 1+5-4 = 2", got)
	}
	if got := lowestBalance(d("1"), rows[:1], t0); !got.Equal(d("6")) {
		t.Fatalf("only an earlier row: %s, want 6", got)
	}
	if got := lowestBalance(d("7"), nil, t0); !got.Equal(d("7")) {
		t.Fatalf("no journal: %s, want the initial balance", got)
	}
}
