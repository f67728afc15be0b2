package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestPostAppliesTheHoldItOvertook: a post that reaches the ledger before
// its hold's task applies the hold first in its own transaction; the
// hold's task then finds it terminal and moves nothing.
func TestPostAppliesTheHoldItOvertook(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	hold := f.holdTask("h1", 1, "10")
	post := f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "10")
	dep := f.enqueue("d1", payment.Deposit, 1, "ETH", "5")

	results := f.apply(post, dep)
	requireOutcome(t, results[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	requireOutcome(t, results[1], payment.StatusConfirmed, payment.OutcomeSuccess)
	st, outcome := f.status("h1")
	require.Equal(t, payment.StatusConfirmed, st)
	require.Equal(t, string(payment.OutcomeHeld), outcome)
	status, by := f.holdStatus("h1")
	require.Equal(t, "posted", status)
	require.Equal(t, "p1", by)
	require.Equal(t, "95", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Equal(t, []string{"withdrawal -10"}, f.journal("p1"))
	require.Empty(t, f.journal("h1"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id = 'h1' AND outcome = 'held'`))

	again := f.apply(hold)[0]
	require.Equal(t, postgres.AlreadyDone, again.Kind, "%v", again.Err)
	require.Equal(t, payment.StatusConfirmed, again.Status)
	require.Equal(t, "95", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id = 'h1'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM holds`))
	f.requireInvariants()
}

// TestVoidAppliesARefusedHoldItOvertook: a pulled hold refused for
// insufficient funds leaves its void unknown_hold, in one transaction.
func TestVoidAppliesARefusedHoldItOvertook(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	hold := f.holdTask("h1", 1, "150")
	void := f.resolveTask("v1", payment.WithdrawalVoid, 1, "h1", "150")
	requireOutcome(t, f.apply(void)[0], payment.StatusFailed, payment.OutcomeUnknownHold)
	st, outcome := f.status("h1")
	require.Equal(t, payment.StatusFailed, st)
	require.Equal(t, string(payment.OutcomeInsufficientFunds), outcome)
	require.Zero(t, f.count(`SELECT count(*) FROM holds`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM notification_outbox WHERE event_id = 'h1' AND kind = 'insufficient_funds'`))
	require.Equal(t, postgres.AlreadyDone, f.apply(hold)[0].Kind)
	require.Equal(t, "100", f.balance(1, "ETH").String())
	f.requireInvariants()
}

// TestPostWaitsForAHoldItMayNotPull: a hold whose row someone else holds
// locked, a hold of another user, and a hold handed to the queue afresh
// (it may have an idempotency record) are left to their own tasks; the
// post waits for them as before, spending no retry budget.
func TestPostWaitsForAHoldItMayNotPull(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.user(2, map[string]string{"ETH": "100"})
	requireWaits := func(r postgres.LedgerResult) {
		t.Helper()
		require.Equal(t, postgres.Retry, r.Kind)
		require.ErrorIs(t, r.Err, payment.ErrUnavailable, "waiting spends no retry budget")
	}

	t.Run("locked elsewhere", func(t *testing.T) {
		f := f.with(t)
		hold := f.holdTask("locked-h", 1, "10")
		post := f.resolveTask("locked-p", payment.WithdrawalPost, 1, "locked-h", "10")
		tx, err := f.sql.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = 'locked-h' FOR UPDATE`)
		require.NoError(t, err)
		requireWaits(f.apply(post)[0])
		require.NoError(t, tx.Rollback(ctx))
		st, _ := f.status("locked-h")
		require.Equal(t, payment.StatusEnqueued, st)
		requireOutcome(t, f.apply(post)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
		require.Equal(t, postgres.AlreadyDone, f.apply(hold)[0].Kind)
	})
	t.Run("another user's hold", func(t *testing.T) {
		f := f.with(t)
		hold := f.holdTask("other-h", 1, "10")
		post := f.resolveTask("other-p", payment.WithdrawalPost, 2, "other-h", "10")
		requireWaits(f.apply(post)[0])
		st, _ := f.status("other-h")
		require.Equal(t, payment.StatusEnqueued, st, "user 2's post never applies user 1's hold")
		requireOutcome(t, f.apply(hold)[0], payment.StatusConfirmed, payment.OutcomeHeld)
		requireOutcome(t, f.apply(post)[0], payment.StatusFailed, payment.OutcomeUnknownHold)
	})
	t.Run("handed to the queue afresh", func(t *testing.T) {
		f := f.with(t)
		hold := f.holdTask("fresh-h", 1, "10")
		_, err := f.sql.Exec(ctx, `UPDATE payment_events SET generation = 1 WHERE event_id = 'fresh-h'`)
		require.NoError(t, err)
		hold.Generation = 1
		post := f.resolveTask("fresh-p", payment.WithdrawalPost, 1, "fresh-h", "10")
		requireWaits(f.apply(post)[0])
		requireOutcome(t, f.apply(hold)[0], payment.StatusConfirmed, payment.OutcomeHeld)
		requireOutcome(t, f.apply(post)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	})
	f.requireInvariants()
}

// TestHoldsRacingTheirPostsSettleOnce races every hold against its post
// or void, each applied through its own pool (two workers' processes) the
// moment both are enqueued, with deposits of the same users in between.
// Whichever transaction meets the hold first applies it, once: balances,
// the holds table, the journal and the idempotency records agree.
func TestHoldsRacingTheirPostsSettleOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	holdsDB, postsDB := f.db, testenv.OpenDB(t, f.dsn)
	const users, pairs = 5, 12
	amounts := []string{"20", "15", "30", "5", "40", "10", "25", "12", "8", "33", "1", "7"}
	type pair struct {
		hold, resolve payment.Event
		deposit       payment.Event
	}
	var all []pair
	for u := int64(1); u <= users; u++ {
		f.user(u, map[string]string{"ETH": "100"})
		for i := range pairs {
			typ := payment.WithdrawalPost
			if i%4 == 3 {
				typ = payment.WithdrawalVoid
			}
			id := fmt.Sprintf("u%d-%d", u, i)
			p := pair{hold: f.holdTask("h-"+id, u, amounts[i])}
			p.resolve = f.resolveTask("r-"+id, typ, u, p.hold.ID, amounts[i])
			p.deposit = f.enqueue("d-"+id, payment.Deposit, u, "ETH", "1")
			all = append(all, p)
		}
	}

	// settle applies one event until the ledger decides it.
	settle := func(db *postgres.DB, e payment.Event) (postgres.LedgerResult, error) {
		for attempt := 0; attempt < 2000; attempt++ {
			r, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: e}}, postgres.LedgerOptions{Notify: true})
			switch {
			case err != nil && !errors.Is(err, payment.ErrRetryable) && !errors.Is(err, payment.ErrUnavailable):
				return postgres.LedgerResult{}, err
			case err == nil && r[0].Kind != postgres.Retry:
				return r[0], nil
			}
			time.Sleep(time.Millisecond)
		}
		return postgres.LedgerResult{}, fmt.Errorf("%s never settled", e.ID)
	}
	holdResults := make([]postgres.LedgerResult, len(all))
	resolveResults := make([]postgres.LedgerResult, len(all))
	errs := make(chan error, 3*len(all))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range all {
		wg.Add(3)
		delay := time.Duration(rand.IntN(3000)) * time.Microsecond
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(delay) // the hold's task is often behind its post
			r, err := settle(holdsDB, p.hold)
			holdResults[i] = r
			errs <- err
		}()
		go func() {
			defer wg.Done()
			<-start
			r, err := settle(postsDB, p.resolve)
			resolveResults[i] = r
			errs <- err
		}()
		go func() {
			defer wg.Done()
			<-start
			_, err := settle(holdsDB, p.deposit)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	pulled := 0
	spent := map[int64]decimal.Decimal{}
	for i, p := range all {
		h, r := holdResults[i], resolveResults[i]
		require.Equal(t, postgres.Applied, r.Kind, "%s: %v", p.resolve.ID, r.Err)
		switch h.Kind {
		case postgres.Applied:
		case postgres.AlreadyDone:
			pulled++ // its post's transaction applied it
		default:
			t.Fatalf("%s: %s %v", p.hold.ID, h.Kind, h.Err)
		}
		st, outcome := f.status(p.hold.ID)
		holdRows := f.count(`SELECT count(*) FROM holds WHERE hold_id = $1`, p.hold.ID)
		switch payment.Outcome(outcome) {
		case payment.OutcomeHeld:
			require.Equal(t, payment.StatusConfirmed, st)
			require.Equal(t, 1, holdRows)
			status, by := f.holdStatus(p.hold.ID)
			require.Equal(t, p.resolve.ID, by, "the hold's own post or void resolved it")
			require.Equal(t, payment.OutcomeSuccess, r.Outcome, p.resolve.ID)
			if p.resolve.Type == payment.WithdrawalPost {
				require.Equal(t, "posted", status)
				require.Equal(t, []string{"withdrawal -" + p.hold.Amount.String()}, f.journal(p.resolve.ID))
				spent[p.hold.UserID] = spent[p.hold.UserID].Add(p.hold.Amount)
			} else {
				require.Equal(t, "voided", status)
				require.Empty(t, f.journal(p.resolve.ID))
			}
		case payment.OutcomeInsufficientFunds:
			require.Equal(t, payment.StatusFailed, st)
			require.Zero(t, holdRows)
			require.Equal(t, payment.OutcomeUnknownHold, r.Outcome, p.resolve.ID)
			require.Empty(t, f.journal(p.resolve.ID))
		default:
			t.Fatalf("%s ended %s/%s", p.hold.ID, st, outcome)
		}
		require.Empty(t, f.journal(p.hold.ID), "a hold writes no journal row")
		for _, id := range []string{p.hold.ID, p.resolve.ID, p.deposit.ID} {
			require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, id), "one idempotency record of %s", id)
		}
	}
	for u := int64(1); u <= users; u++ {
		want := dec("100").Add(dec(fmt.Sprint(pairs))).Sub(spent[u])
		require.Equal(t, want.String(), f.balance(u, "ETH").String(), "user %d", u)
		require.Equal(t, "0", f.held(u, "ETH"), "every hold of user %d resolved", u)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM holds WHERE status = 'open'`))
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed', 'failed')`))
	t.Logf("%d of %d holds applied by the transaction of their post or void", pulled, len(all))
	require.Positive(t, pulled, "no post overtook its hold: the race did not happen")
	f.requireInvariants()
}

// TestPullHoldsFindsRowsByKey: the pull reads payment_events by primary
// key only, under the hot path's generic plan, whatever the backlog.
func TestPullHoldsFindsRowsByKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tx, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, postgres.QueryText("hot_path_plans"))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE pull_holds(text[], bigint[], text[], text[]) AS "+postgres.QueryText("ledger_pull_holds"))
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN EXECUTE pull_holds('{p1}', '{1}', '{ETH}', '{p1}')`)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	require.NotContains(t, text, "Seq Scan on payment_events", text)
	require.Contains(t, text, "Index Scan using payment_events_pkey on payment_events p", text)
}

// TestRefusedHoldAndItsPostInOneBatch: a hold refused for insufficient
// funds and its post in one task end together; the post does not wait
// for what its own transaction decided.
func TestRefusedHoldAndItsPostInOneBatch(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	hold := f.holdTask("h1", 1, "150")
	post := f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "150")
	results := f.apply(hold, post)
	requireOutcome(t, results[0], payment.StatusFailed, payment.OutcomeInsufficientFunds)
	requireOutcome(t, results[1], payment.StatusFailed, payment.OutcomeUnknownHold)
	require.Zero(t, f.count(`SELECT count(*) FROM holds`))
	require.Equal(t, "100", f.balance(1, "ETH").String())
	f.requireInvariants()
}
