package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// enqueueEvent accepts e as the api would and claims it as the enqueuer
// does, returning the task.
func (f *fixture) enqueueEvent(e payment.Event) payment.Event {
	f.t.Helper()
	ctx := context.Background()
	e.TraceID = "trace-" + e.ID
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	claimed, err := f.db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	for _, c := range claimed {
		if c.Event.ID == e.ID {
			return c.Event
		}
	}
	f.t.Fatalf("event %s was not claimed", e.ID)
	return payment.Event{}
}

func (f *fixture) holdTask(id string, user int64, amount string) payment.Event {
	f.t.Helper()
	return f.enqueueEvent(payment.Event{ID: id, Type: payment.WithdrawalHold, UserID: user, Asset: "ETH", Amount: dec(amount),
		Network: "ETH_MAINNET", ToAddress: "0x00000000000000000000000000000000000000aa"})
}

// resolveTask is a post or void as the api stores it: the hold's asset and
// amount.
func (f *fixture) resolveTask(id string, typ payment.EventType, user int64, holdID, amount string) payment.Event {
	f.t.Helper()
	return f.enqueueEvent(payment.Event{ID: id, Type: typ, UserID: user, Asset: "ETH", Amount: dec(amount), HoldID: holdID})
}

func (f *fixture) held(user int64, asset string) string {
	f.t.Helper()
	var text string
	require.NoError(f.t, f.sql.QueryRow(context.Background(),
		`SELECT COALESCE((SELECT held::text FROM balances WHERE user_id=$1 AND asset=$2), '0')`, user, asset).Scan(&text))
	return dec(text).String()
}

func (f *fixture) holdStatus(id string) (string, string) {
	f.t.Helper()
	var status, by string
	require.NoError(f.t, f.sql.QueryRow(context.Background(),
		`SELECT status, COALESCE(resolved_by, '') FROM holds WHERE hold_id = $1`, id).Scan(&status, &by))
	return status, by
}

func (f *fixture) journal(source string) []string {
	f.t.Helper()
	rows, err := f.sql.Query(context.Background(), `SELECT event_type || ' ' || amount::numeric(38,0)::text FROM balance_events WHERE source_event_id = $1 ORDER BY id`, source)
	require.NoError(f.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(f.t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(f.t, rows.Err())
	return out
}

func requireOutcome(t *testing.T, r postgres.LedgerResult, status payment.Status, outcome payment.Outcome) {
	t.Helper()
	require.Equal(t, postgres.Applied, r.Kind, "%v", r.Err)
	require.Equal(t, status, r.Status)
	require.Equal(t, outcome, r.Outcome)
}

func TestHoldThenPostDebitsOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	requireOutcome(t, f.apply(f.holdTask("h1", 1, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
	require.Equal(t, "100", f.balance(1, "ETH").String())
	require.Equal(t, "30", f.held(1, "ETH"))
	require.Empty(t, f.journal("h1"), "a hold writes no journal row")
	status, by := f.holdStatus("h1")
	require.Equal(t, "open", status)
	require.Empty(t, by)

	post := f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "30")
	requireOutcome(t, f.apply(post)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "70", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Equal(t, []string{"withdrawal -30"}, f.journal("p1"))
	status, by = f.holdStatus("h1")
	require.Equal(t, "posted", status)
	require.Equal(t, "p1", by)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM notification_outbox WHERE kind = 'withdrawal_posted' AND event_id = 'p1'`))

	// The same task again (a redelivery) does nothing more.
	again := f.apply(post)[0]
	require.Equal(t, postgres.AlreadyDone, again.Kind)
	require.Equal(t, "70", f.balance(1, "ETH").String())
	require.Len(t, f.journal("p1"), 1)
	f.requireInvariants()
}

func TestHoldThenVoidRestoresAvailable(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.apply(f.holdTask("h1", 1, "100"))
	require.Equal(t, "100", f.held(1, "ETH"))
	// Nothing is available while the hold is open.
	w := f.enqueue("w1", payment.Withdrawal, 1, "ETH", "1")
	requireOutcome(t, f.apply(w)[0], payment.StatusFailed, payment.OutcomeInsufficientFunds)

	void := f.resolveTask("v1", payment.WithdrawalVoid, 1, "h1", "100")
	requireOutcome(t, f.apply(void)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "100", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Empty(t, f.journal("v1"))
	status, by := f.holdStatus("h1")
	require.Equal(t, "voided", status)
	require.Equal(t, "v1", by)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM notification_outbox WHERE kind = 'hold_voided' AND event_id = 'v1'`))

	w2 := f.enqueue("w2", payment.Withdrawal, 1, "ETH", "100")
	requireOutcome(t, f.apply(w2)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.True(t, f.balance(1, "ETH").IsZero())
	f.requireInvariants()
}

func TestHoldResolvesOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.user(2, map[string]string{"ETH": "100"})
	f.apply(f.holdTask("h1", 1, "10"), f.holdTask("h2", 1, "20"))

	// Void, then post: hold_closed, no money.
	requireOutcome(t, f.apply(f.resolveTask("v1", payment.WithdrawalVoid, 1, "h1", "10"))[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	requireOutcome(t, f.apply(f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "10"))[0], payment.StatusFailed, payment.OutcomeHoldClosed)
	require.Empty(t, f.journal("p1"))
	// Post, then void, and a second post: hold_closed.
	requireOutcome(t, f.apply(f.resolveTask("p2", payment.WithdrawalPost, 1, "h2", "20"))[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	requireOutcome(t, f.apply(f.resolveTask("v2", payment.WithdrawalVoid, 1, "h2", "20"))[0], payment.StatusFailed, payment.OutcomeHoldClosed)
	requireOutcome(t, f.apply(f.resolveTask("p3", payment.WithdrawalPost, 1, "h2", "20"))[0], payment.StatusFailed, payment.OutcomeHoldClosed)
	require.Equal(t, "80", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	f.requireInvariants()
}

func TestPostAndVoidInOneBatchResolveOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	hold := f.holdTask("h1", 1, "10")
	post := f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "10")
	void := f.resolveTask("v1", payment.WithdrawalVoid, 1, "h1", "10")
	// Hold, post and void in one transaction: the hold opens, the post
	// (accepted first) resolves it, the void finds it closed.
	results := f.apply(hold, post, void)
	requireOutcome(t, results[0], payment.StatusConfirmed, payment.OutcomeHeld)
	requireOutcome(t, results[1], payment.StatusConfirmed, payment.OutcomeSuccess)
	requireOutcome(t, results[2], payment.StatusFailed, payment.OutcomeHoldClosed)
	require.Equal(t, "90", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	f.requireInvariants()
}

func TestPostOfAnotherUsersHoldIsUnknown(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.user(2, map[string]string{"ETH": "100"})
	f.apply(f.holdTask("h1", 1, "10"))
	requireOutcome(t, f.apply(f.resolveTask("p1", payment.WithdrawalPost, 2, "h1", "10"))[0], payment.StatusFailed, payment.OutcomeUnknownHold)
	requireOutcome(t, f.apply(f.resolveTask("v1", payment.WithdrawalVoid, 2, "h1", "10"))[0], payment.StatusFailed, payment.OutcomeUnknownHold)
	require.Equal(t, "100", f.balance(1, "ETH").String())
	require.Equal(t, "100", f.balance(2, "ETH").String())
	require.Equal(t, "10", f.held(1, "ETH"))
	status, _ := f.holdStatus("h1")
	require.Equal(t, "open", status)
	require.Zero(t, f.count(`SELECT count(*) FROM balance_events`))

	// A hold refused for insufficient funds has no row: its post is unknown.
	requireOutcome(t, f.apply(f.holdTask("h2", 2, "1000"))[0], payment.StatusFailed, payment.OutcomeInsufficientFunds)
	requireOutcome(t, f.apply(f.resolveTask("p2", payment.WithdrawalPost, 2, "h2", "1000"))[0], payment.StatusFailed, payment.OutcomeUnknownHold)
	f.requireInvariants()
}

// TestPostOnAnotherNetworkThanItsHoldIsMismatch: a post is checked on
// the chain and claims its payout on its own network (its asset's when
// it names none). One on another network than its hold's would settle the
// hold with a payment on the wrong chain: it ends failed/mismatch, like a
// post of another amount, with no money moved, no claim, the hold open.
func TestPostOnAnotherNetworkThanItsHoldIsMismatch(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	requireOutcome(t, f.apply(f.holdTask("h1", 1, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
	onBase := f.enqueueEvent(payment.Event{ID: "h2", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH", Amount: dec("20"),
		Network: "BASE_MAINNET", ToAddress: "0x00000000000000000000000000000000000000aa"})
	requireOutcome(t, f.apply(onBase)[0], payment.StatusConfirmed, payment.OutcomeHeld)
	require.Equal(t, "50", f.held(1, "ETH"))

	post := func(id, holdID, amount, network, tx string) postgres.LedgerItem {
		e := f.enqueueEvent(payment.Event{ID: id, Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: dec(amount),
			HoldID: holdID, TxHash: tx, Network: network})
		return payoutEvidence(e, "0x"+strings.Repeat("b", 64), 0, payment.TransferNative)
	}
	apply := func(item postgres.LedgerItem) postgres.LedgerResult {
		results, err := f.db.ApplyBatch(context.Background(), []postgres.LedgerItem{item}, postgres.LedgerOptions{Notify: true})
		require.NoError(t, err)
		return results[0]
	}
	// h1 is on ETH_MAINNET, h2 on BASE_MAINNET; a post naming no network
	// is on its asset's, ETH_MAINNET.
	requireOutcome(t, apply(post("p1", "h1", "30", "BASE_MAINNET", txA)), payment.StatusFailed, payment.OutcomeMismatch)
	requireOutcome(t, apply(post("p2", "h2", "20", "", txB)), payment.StatusFailed, payment.OutcomeMismatch)
	require.Contains(t, f.eventError("p1"), "post on BASE_MAINNET, the hold on ETH_MAINNET")
	require.Contains(t, f.eventError("p2"), "post on ETH_MAINNET, the hold on BASE_MAINNET")
	for _, hold := range []string{"h1", "h2"} {
		status, by := f.holdStatus(hold)
		require.Equal(t, "open", status, hold)
		require.Empty(t, by, hold)
	}
	require.Equal(t, "100", f.balance(1, "ETH").String())
	require.Equal(t, "50", f.held(1, "ETH"))
	require.Zero(t, f.count(`SELECT count(*) FROM balance_events`))
	require.Zero(t, f.count(`SELECT count(*) FROM payout_transfers`))
	require.Zero(t, f.count(`SELECT count(*) FROM notification_outbox WHERE event_id IN ('p1', 'p2')`))
	f.requireInvariants()

	// On the hold's network (named, or its asset's) the same posts settle.
	requireOutcome(t, apply(post("p3", "h1", "30", "", txA)), payment.StatusConfirmed, payment.OutcomeSuccess)
	requireOutcome(t, apply(post("p4", "h2", "20", "BASE_MAINNET", txB)), payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "50", f.balance(1, "ETH").String())
	require.Equal(t, "0", f.held(1, "ETH"))
	require.Equal(t, []string{"withdrawal -30"}, f.journal("p3"))
	require.Equal(t, []string{"withdrawal -20"}, f.journal("p4"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payout_transfers WHERE event_id = 'p3' AND network = 'ETH_MAINNET'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payout_transfers WHERE event_id = 'p4' AND network = 'BASE_MAINNET'`))
	f.requireInvariants()
}

// TestPostWaitsForItsHoldToSettle: a post whose hold's event is still
// pending (not yet handed to the queue, so no ledger may apply it) waits
// for it, spending no retry budget, and the rest of its batch commits.
func TestPostWaitsForItsHoldToSettle(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	ctx := context.Background()
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH",
		Amount: dec("10"), Network: "ETH_MAINNET", TraceID: "trace-h1"}, Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	// The enqueuer passes the hold by (another scheduler holds its row).
	tx, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = 'h1' FOR UPDATE`)
	require.NoError(t, err)
	post := f.resolveTask("p1", payment.WithdrawalPost, 1, "h1", "10")
	dep := f.enqueue("d1", payment.Deposit, 1, "ETH", "5")
	require.NoError(t, tx.Rollback(ctx))
	st, _ := f.status("h1")
	require.Equal(t, payment.StatusPending, st)

	results := f.apply(post, dep)
	r := results[0]
	require.Equal(t, postgres.Retry, r.Kind)
	require.ErrorIs(t, r.Err, payment.ErrUnavailable, "waiting spends no retry budget")
	st, _ = f.status("p1")
	require.Equal(t, payment.StatusEnqueued, st)
	requireOutcome(t, results[1], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "105", f.balance(1, "ETH").String())
	f.apply(f.enqueueClaimed("h1"))
	requireOutcome(t, f.apply(post)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "95", f.balance(1, "ETH").String())
	require.Equal(t, []string{"withdrawal -10"}, f.journal("p1"))
	f.requireInvariants()
}

// enqueueClaimed claims the pending event id as the enqueuer does.
func (f *fixture) enqueueClaimed(id string) payment.Event {
	f.t.Helper()
	claimed, err := f.db.ClaimOutbox(context.Background(), 1000, 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	for _, c := range claimed {
		if c.Event.ID == id {
			return c.Event
		}
	}
	f.t.Fatalf("event %s was not claimed", id)
	return payment.Event{}
}

func TestDebitsTakeOnlyFromAvailable(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "99"})
	// The deposit the compensation below reverses.
	requireOutcome(t, f.apply(f.enqueue("x", payment.Deposit, 1, "ETH", "1"))[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	f.apply(f.holdTask("h1", 1, "60"))
	for _, typ := range []payment.EventType{payment.Withdrawal, payment.WithdrawalFee} {
		e := f.enqueue("over-"+string(typ), typ, 1, "ETH", "41")
		requireOutcome(t, f.apply(e)[0], payment.StatusFailed, payment.OutcomeInsufficientFunds)
	}
	requireOutcome(t, f.apply(f.holdTask("h2", 1, "41"))[0], payment.StatusFailed, payment.OutcomeInsufficientFunds)
	requireOutcome(t, f.apply(f.enqueue("fits", payment.Withdrawal, 1, "ETH", "40"))[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, "60", f.balance(1, "ETH").String())
	require.Equal(t, "60", f.held(1, "ETH"))

	// A compensation that only held money could cover goes to the DLQ
	// (made as a reorg makes it: x is then marked reorged).
	reversal, err := f.db.ReverseDeposit(context.Background(), "x", "gone from the chain", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Compensating, reversal)
	r := f.apply(f.enqueueClaimed("reorg:x"))[0]
	requireOutcome(t, r, payment.StatusFailed, payment.OutcomeDeadLettered)
	require.NotEmpty(t, r.Alert)
	require.Equal(t, "60", f.balance(1, "ETH").String())
	require.Equal(t, []string{"withdrawal -40"}, f.journal("fits"))
	f.requireInvariants()
}

func TestHeldNeverExceedsBalanceByConstraint(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "10"})
	_, err := f.sql.Exec(context.Background(), `UPDATE balances SET held = 11 WHERE user_id = 1`)
	require.ErrorContains(t, err, "balances_held_within")
	_, err = f.sql.Exec(context.Background(), `UPDATE balances SET held = -1 WHERE user_id = 1`)
	require.ErrorContains(t, err, "balances_held_within")
}

// TestConcurrentHoldsNeverOverReserve races 50 holds of 10 against a
// balance of 100, each on its own connection and transaction, while a
// sampler reads SUM(open holds) and the balance on one snapshot.
func TestConcurrentHoldsNeverOverReserve(t *testing.T) {
	f := newFixture(t)
	f.user(7, map[string]string{"ETH": "100"})
	const n = 50
	tasks := make([]payment.Event, n)
	for i := range tasks {
		tasks[i] = f.holdTask(fmt.Sprintf("h-%d", i), 7, "10")
	}
	stop := make(chan struct{})
	sampled := make(chan int, 1)
	go func() {
		samples := 0
		defer func() { sampled <- samples }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var over bool
			err := f.sql.QueryRow(context.Background(), `SELECT COALESCE((SELECT SUM(amount) FROM holds WHERE user_id = 7 AND status = 'open'), 0)
				> (SELECT balance FROM balances WHERE user_id = 7 AND asset = 'ETH')`).Scan(&over)
			if err != nil || over {
				t.Errorf("sample %d: over=%v err=%v", samples, over, err)
				return
			}
			samples++
		}
	}()
	var wg sync.WaitGroup
	results := make([]postgres.LedgerResult, n)
	for i := range tasks {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for range 50 {
				r, err := f.db.ApplyBatch(context.Background(), []postgres.LedgerItem{{Event: tasks[i]}}, postgres.LedgerOptions{})
				if err == nil {
					results[i] = r[0]
					return
				}
				require.ErrorIs(t, err, payment.ErrRetryable)
			}
		}(i)
	}
	wg.Wait()
	close(stop)
	require.Positive(t, <-sampled)
	held := 0
	for _, r := range results {
		if r.Outcome == payment.OutcomeHeld {
			held++
		} else {
			require.Equal(t, payment.OutcomeInsufficientFunds, r.Outcome)
		}
	}
	require.Equal(t, 10, held)
	require.Equal(t, "100", f.held(7, "ETH"))
	require.Equal(t, "100", f.balance(7, "ETH").String())
	require.Zero(t, f.count(`SELECT count(*) FROM balance_events`))
	f.requireInvariants()
}

// TestReplayedPostWaitingForItsHoldLeavesTheBatch: a post handed to the
// ledger again after a dead letter (its idempotency record says
// dead_lettered) whose hold has not settled waits like any other post.
// Its key gets no outcome in this batch, so it must not be rewritten: an
// empty outcome broke the CHECK and rolled back the innocent deposit
// beside it.
func TestReplayedPostWaitingForItsHoldLeavesTheBatch(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.holdTask("h-wait", 1, "10")
	// The hold was handed to the queue afresh (generation 1): no batch of
	// its post may pull it, so the post must wait for it.
	_, err := f.sql.Exec(ctx, `UPDATE payment_events SET generation = 1 WHERE event_id = 'h-wait'`)
	require.NoError(t, err)
	post := f.resolveTask("p-replayed", payment.WithdrawalPost, 1, "h-wait", "10")
	// As after a ledger dead letter and a DLQ replay: generation 1 and an
	// idempotency record dead_lettered.
	_, err = f.sql.Exec(ctx, `UPDATE payment_events SET generation = 1 WHERE event_id = 'p-replayed'`)
	require.NoError(t, err)
	post.Generation = 1
	_, err = f.sql.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id, outcome) VALUES ($1, 'p-replayed', 'dead_lettered')`, post.Key())
	require.NoError(t, err)
	dep := f.enqueue("d-ok", payment.Deposit, 1, "ETH", "5")

	results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: post}, {Event: dep}}, postgres.LedgerOptions{})
	require.NoError(t, err, "a waiting post must not fail its batch")
	require.Equal(t, postgres.Retry, results[0].Kind)
	requireOutcome(t, results[1], payment.StatusConfirmed, payment.OutcomeSuccess)
}

// TestInitialBalanceBelowOpenHoldsIsRefusedClearly: a hold writes no
// journal row, so an initial balance may still be corrected under one;
// a correction below what the open holds keep is a clear refusal
// (payment.ErrInvalid naming the holds), not a CHECK violation.
func TestInitialBalanceBelowOpenHoldsIsRefusedClearly(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	requireOutcome(t, f.apply(f.holdTask("h1", 1, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
	err := f.db.SetInitialBalance(context.Background(), 1, "ETH", dec("10"))
	require.ErrorIs(t, err, payment.ErrInvalid)
	require.Contains(t, err.Error(), "below the 30 the user's open holds keep")
	require.Equal(t, "100", f.balance(1, "ETH").String())
	require.NoError(t, f.db.SetInitialBalance(context.Background(), 1, "ETH", dec("30")), "down to the held amount is allowed")
	require.Equal(t, "30", f.balance(1, "ETH").String())
}
