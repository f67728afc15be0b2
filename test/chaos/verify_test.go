package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
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
// what happened and is allowed.
type verdict struct {
	findings []string
	notes    []string
	report   string // the invariant checker's
}

func (v *verdict) fail(format string, args ...any) {
	v.findings = append(v.findings, fmt.Sprintf(format, args...))
}

func (v *verdict) note(format string, args ...any) {
	v.notes = append(v.notes, fmt.Sprintf(format, args...))
}

// verify compares the books with what the provider was told, on a
// quiet system (every process stopped).
func verify(ctx context.Context, db *postgres.DB, pool *pgxpool.Pool, s *sender, initial map[balanceKey]decimal.Decimal, windows []window) *verdict {
	v := &verdict{}
	report, err := invariant.Check(ctx, db, invariant.Quiet())
	if err != nil {
		v.fail("invariant check did not run: %v", err)
	} else {
		v.report = report.String()
		if !report.OK() {
			v.fail("the invariant checker reports violations (see its report)")
		}
	}
	stored, err := loadEvents(ctx, pool)
	if err != nil {
		v.fail("reading the books: %v", err)
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
		v.fail("api answer: %s", a)
	}
	if anomalous > len(anomalies) {
		v.fail("... and %d more api answers the contract forbids", anomalous-len(anomalies))
	}
	for _, u := range undelivered {
		v.fail("never got a definitive answer within %s: %s", deliveryMax, u)
	}

	// Nothing lost: every acknowledged event is stored, as sent, and done.
	lost := 0
	for id := range acked {
		e, ok := stored[id]
		if !ok {
			lost++
			if lost <= 10 {
				v.fail("LOST: %s was acknowledged with 200 but is not stored", id)
			}
			continue
		}
		want := specs[id]
		if e.Type != want.Type || e.User != want.User || e.Asset != want.Asset || !decimal.RequireFromString(e.Amount).Equal(decimal.RequireFromString(want.Amount)) {
			v.fail("%s stored as %+v, sent as %+v", id, e.spec, want)
		}
		if e.status != "confirmed" && e.status != "failed" {
			v.fail("%s is still %s after the settle wait (retries %d, generation %d)", id, e.status, e.retries, e.gen)
		}
	}
	if lost > 10 {
		v.fail("LOST: %d acknowledged events in all", lost)
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
		if !acked[id] {
			v.fail("%s is stored but the provider never got a 200 for it", id)
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
			// Nothing doubled: one journal row, for the event's amount.
			if e.journalRows != 1 || !e.journalSum.Equal(signed) {
				v.fail("DOUBLE/MISSING CREDIT: %s confirmed with %d journal rows summing %s (want one of %s)", id, e.journalRows, e.journalSum, signed)
			}
			if e.key != "success" {
				v.fail("%s confirmed but its idempotency record says %q", id, e.key)
			}
			k := balanceKey{e.User, e.Asset}
			expected[k] = expected[k].Add(signed)
		case "failed":
			if e.journalRows != 0 {
				v.fail("%s failed but has %d journal rows", id, e.journalRows)
			}
			switch e.outcome {
			case "insufficient_funds":
				if e.credit() {
					v.fail("%s is a %s that failed for insufficient funds", id, e.Type)
				}
				if e.key != "insufficient_funds" {
					v.fail("%s failed for insufficient funds but its idempotency record says %q", id, e.key)
				}
			case "dead_lettered":
				if len(e.dlq) == 0 {
					v.fail("%s dead-lettered without a DLQ row", id)
				}
			default:
				v.fail("%s failed with outcome %q, which no fault here can cause", id, e.outcome)
			}
		}
		// Every DLQ row must be explained by a fault.
		for _, d := range e.dlq {
			if why, ok := explain(d, windows); ok {
				justified = append(justified, fmt.Sprintf("dlq %d %s (%s, event now %s): %s; %s", d.id, d.eventID, d.source, e.status, d.reason, why))
			} else {
				v.fail("UNEXPLAINED DLQ row %d for %s (source %s, at %s, event now %s/%s): %s",
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
		v.fail("reading balances: %v", err)
		return v
	}
	for k, want := range expected {
		if got := balances[k]; !got.Equal(want) {
			v.fail("balance of user %d in %s is %s; the provider's events say %s", k.user, k.asset, got, want)
		}
	}
	for k, got := range balances {
		if _, ok := expected[k]; !ok && !got.IsZero() {
			v.fail("balance of user %d in %s is %s; no event touched it", k.user, k.asset, got)
		}
	}
	if orphans, err := orphanDLQ(ctx, pool, stored); err != nil {
		v.fail("reading the DLQ: %v", err)
	} else {
		for _, d := range orphans {
			v.fail("UNEXPLAINED DLQ row %d names no stored event %q (source %s): %s", d.id, d.eventID, d.source, d.reason)
		}
	}
	return v
}

// explain accepts a dead letter only as the retry budget of a task that
// ran out while PostgreSQL was unreachable for the workers.
func explain(d dlqRow, windows []window) (string, bool) {
	if !strings.Contains(d.reason, "retries exhausted") {
		return "", false
	}
	for _, w := range windows {
		if !cutsWorkersFromPostgres(w.fault) {
			continue
		}
		if !d.created.Before(w.from) && d.created.Before(w.to.Add(dlqSlack)) {
			return fmt.Sprintf("retry budget spent during %v (%s–%s)", w.fault, w.from.Format("15:04:05.000"), w.to.Format("15:04:05.000")), true
		}
	}
	return "", false
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
	rows, err := pool.Query(ctx, `SELECT event_id, event_type, user_id, asset, amount::text, status, COALESCE(outcome, ''), retry_count, generation FROM payment_events`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		e := &storedEvent{}
		if err := rows.Scan(&e.ID, &e.Type, &e.User, &e.Asset, &e.Amount, &e.status, &e.outcome, &e.retries, &e.gen); err != nil {
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
