package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/ledger"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// settleItem applies one item through db until the ledger decides it: a
// post waiting for its hold, or a lock wait, is retried as the worker
// retries it.
func settleItem(ctx context.Context, db *postgres.DB, item postgres.LedgerItem) (postgres.LedgerResult, error) {
	for range 2000 {
		r, err := db.ApplyBatch(ctx, []postgres.LedgerItem{item}, postgres.LedgerOptions{Notify: true})
		switch {
		case err != nil && !errors.Is(err, payment.ErrRetryable) && !errors.Is(err, payment.ErrUnavailable):
			return postgres.LedgerResult{}, err
		case err == nil && r[0].Kind != postgres.Retry:
			return r[0], nil
		}
		time.Sleep(time.Millisecond)
	}
	return postgres.LedgerResult{}, fmt.Errorf("%s never settled", item.Event.ID)
}

// TestResolutionsOfOneHoldRaceAcrossWorkers races, per user, everything
// that can touch one hold at once, each on its own goroutine and one of
// two pools (two workers' connections): a trusted post, a post with its
// payout on chain, a void, and a withdrawal that fits only once the hold
// is voided; for half the users the hold itself is still in the queue, so
// whichever resolution meets it first applies it. Exactly one resolution
// wins; the others end hold_closed; the balance, the journal, the holds
// table, the payout claims and the idempotency records agree.
func TestResolutionsOfOneHoldRaceAcrossWorkers(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	pools := []*postgres.DB{f.db, testenv.OpenDB(t, f.dsn)}
	const users = 16
	block := "0x" + strings.Repeat("b", 64)
	type round struct {
		hold                  payment.Event
		held                  bool // applied before the race
		post, chainPost, void payment.Event
		withdrawal            payment.Event
		tx                    string
		results               map[string]postgres.LedgerResult
		holdResult            postgres.LedgerResult
		resultsMu             sync.Mutex
	}
	rounds := make([]*round, users)
	for i := range rounds {
		u := int64(i + 1)
		f.user(u, map[string]string{"ETH": "100"})
		r := &round{tx: fmt.Sprintf("0x%064x", 0x1000+i), results: map[string]postgres.LedgerResult{}}
		r.hold = f.holdTask(fmt.Sprintf("h-%d", u), u, "60")
		if i%2 == 0 {
			requireOutcome(t, f.apply(r.hold)[0], payment.StatusConfirmed, payment.OutcomeHeld)
			r.held = true
		}
		r.post = f.resolveTask(fmt.Sprintf("p-%d", u), payment.WithdrawalPost, u, r.hold.ID, "60")
		r.chainPost = f.postWithTx(fmt.Sprintf("pc-%d", u), u, r.hold.ID, "60", r.tx)
		r.void = f.resolveTask(fmt.Sprintf("v-%d", u), payment.WithdrawalVoid, u, r.hold.ID, "60")
		r.withdrawal = f.enqueue(fmt.Sprintf("w-%d", u), payment.Withdrawal, u, "ETH", "50")
		rounds[i] = r
	}

	errs := make(chan error, users*6)
	start := make(chan struct{})
	var wg sync.WaitGroup
	run := func(r *round, pool int, item postgres.LedgerItem) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := settleItem(ctx, pools[pool], item)
			r.resultsMu.Lock()
			if item.Event.ID == r.hold.ID {
				r.holdResult = res
			} else {
				r.results[item.Event.ID] = res
			}
			r.resultsMu.Unlock()
			errs <- err
		}()
	}
	for _, r := range rounds {
		run(r, 0, postgres.LedgerItem{Event: r.post})
		run(r, 1, payoutEvidence(r.chainPost, block, 0, payment.TransferNative))
		run(r, 0, postgres.LedgerItem{Event: r.void})
		run(r, 1, postgres.LedgerItem{Event: r.withdrawal})
		if !r.held {
			run(r, 1, postgres.LedgerItem{Event: r.hold})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	wins := map[string]int{}
	for _, r := range rounds {
		u := r.hold.UserID
		if !r.held {
			require.Contains(t, []ledger.ResultKind{postgres.Applied, postgres.AlreadyDone}, r.holdResult.Kind, "%s: %v", r.hold.ID, r.holdResult.Err)
		}
		st, outcome := f.status(r.hold.ID)
		if payment.Outcome(outcome) == payment.OutcomeInsufficientFunds {
			// The withdrawal came first and left 50 available: the hold
			// reserved nothing, its resolutions are unknown_hold.
			require.False(t, r.held)
			require.Equal(t, payment.StatusFailed, st)
			require.Zero(t, f.count(`SELECT count(*) FROM holds WHERE hold_id = $1`, r.hold.ID))
			for _, e := range []payment.Event{r.post, r.chainPost, r.void} {
				require.Equal(t, postgres.Applied, r.results[e.ID].Kind, "%s: %v", e.ID, r.results[e.ID].Err)
				require.Equal(t, payment.OutcomeUnknownHold, r.results[e.ID].Outcome, e.ID)
				require.Empty(t, f.journal(e.ID))
			}
			require.Equal(t, payment.OutcomeSuccess, r.results[r.withdrawal.ID].Outcome)
			require.Equal(t, "50", f.balance(u, "ETH").String())
			require.Equal(t, "0", f.held(u, "ETH"))
			require.Zero(t, f.count(`SELECT count(*) FROM payout_transfers WHERE tx_hash = $1`, r.tx))
			wins["refused hold"]++
			continue
		}
		require.Equal(t, payment.StatusConfirmed, st, r.hold.ID)
		require.Equal(t, string(payment.OutcomeHeld), outcome, r.hold.ID)

		var winner *payment.Event
		for _, e := range []payment.Event{r.post, r.chainPost, r.void} {
			res := r.results[e.ID]
			require.Equal(t, postgres.Applied, res.Kind, "%s: %v", e.ID, res.Err)
			switch res.Outcome {
			case payment.OutcomeSuccess:
				require.Nil(t, winner, "user %d: %s and %s both resolved %s", u, e.ID, winner)
				e := e
				winner = &e
			case payment.OutcomeHoldClosed:
				require.Equal(t, payment.StatusFailed, res.Status, e.ID)
				require.Empty(t, f.journal(e.ID), e.ID)
			default:
				t.Fatalf("%s ended %s/%s", e.ID, res.Status, res.Outcome)
			}
		}
		require.NotNil(t, winner, "user %d: nothing resolved the hold", u)
		switch winner.ID {
		case r.post.ID:
			wins["post"]++
		case r.chainPost.ID:
			wins["post on chain"]++
		default:
			wins["void"]++
		}
		status, by := f.holdStatus(r.hold.ID)
		require.Equal(t, winner.ID, by)
		posted := winner.Type == payment.WithdrawalPost
		if posted {
			require.Equal(t, "posted", status)
			require.Equal(t, []string{"withdrawal -60"}, f.journal(winner.ID))
		} else {
			require.Equal(t, "voided", status)
		}
		payouts := 0
		if winner.ID == r.chainPost.ID {
			payouts = 1
		}
		require.Equal(t, payouts, f.count(`SELECT count(*) FROM payout_transfers WHERE tx_hash = $1`, r.tx), "user %d", u)

		w := r.results[r.withdrawal.ID]
		require.Equal(t, postgres.Applied, w.Kind, "%s: %v", r.withdrawal.ID, w.Err)
		want := dec("100")
		if posted {
			want = want.Sub(dec("60"))
		}
		if w.Outcome == payment.OutcomeSuccess {
			require.False(t, posted, "user %d: the withdrawal took money the post had paid out", u)
			require.Equal(t, []string{"withdrawal -50"}, f.journal(r.withdrawal.ID))
			want = want.Sub(dec("50"))
		} else {
			require.Equal(t, payment.OutcomeInsufficientFunds, w.Outcome)
			require.Empty(t, f.journal(r.withdrawal.ID))
		}
		require.Equal(t, want.String(), f.balance(u, "ETH").String(), "user %d", u)
		require.Equal(t, "0", f.held(u, "ETH"), "user %d", u)
		for _, id := range []string{r.hold.ID, r.post.ID, r.chainPost.ID, r.void.ID, r.withdrawal.ID} {
			require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, id), "one idempotency record of %s", id)
		}
	}
	t.Logf("winners: %v", wins)
	require.Zero(t, f.count(`SELECT count(*) FROM holds WHERE status = 'open'`))
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed', 'failed')`))
	f.requireInvariants()
}

// TestPostRacingItsOwnReplayAndAVoid: a post dead-lettered by its worker
// and replayed by an operator is in the queue twice, the old generation's
// task (a worker still holding it) and the replay's; with a void of the
// same hold they race on two pools. The old task is stale; the replayed
// post and the void resolve the hold once between them.
func TestPostRacingItsOwnReplayAndAVoid(t *testing.T) {
	ctx := context.Background()
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			f := newFixture(t)
			f.user(1, map[string]string{"ETH": "100"})
			requireOutcome(t, f.apply(f.holdTask("h", 1, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
			old := f.resolveTask("p", payment.WithdrawalPost, 1, "h", "30")
			id := f.deadLetter(old, "retries exhausted")
			replayed, err := f.db.ReplayDeadLetter(ctx, id, "alice", "")
			require.NoError(t, err)
			require.Equal(t, postgres.Reopened, replayed)
			void := f.resolveTask("v", payment.WithdrawalVoid, 1, "h", "30") // claims the replay too
			var fresh payment.Event
			require.NoError(t, f.sql.QueryRow(ctx, `SELECT generation FROM payment_events WHERE event_id = 'p' AND status = 'enqueued'`).Scan(&fresh.Generation))
			fresh = payment.Event{ID: old.ID, Type: old.Type, UserID: old.UserID, Asset: old.Asset, Amount: old.Amount, HoldID: old.HoldID,
				Generation: fresh.Generation, TraceID: old.TraceID}
			require.Equal(t, old.Generation+1, fresh.Generation)

			pools := []*postgres.DB{f.db, testenv.OpenDB(t, f.dsn)}
			items := []payment.Event{old, fresh, void}
			results := make([]postgres.LedgerResult, len(items))
			errs := make([]error, len(items))
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, e := range items {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					results[i], errs[i] = settleItem(ctx, pools[(i+round)%2], postgres.LedgerItem{Event: e})
				}()
			}
			close(start)
			wg.Wait()
			for i := range items {
				require.NoError(t, errs[i])
			}
			// The dead generation's task moves nothing: stale, or already
			// done when the replay settled first.
			require.Contains(t, []ledger.ResultKind{postgres.Stale, postgres.AlreadyDone}, results[0].Kind, "%v", results[0].Err)
			post, v := results[1], results[2]
			require.Equal(t, postgres.Applied, post.Kind, "%v", post.Err)
			require.Equal(t, postgres.Applied, v.Kind, "%v", v.Err)
			status, by := f.holdStatus("h")
			switch {
			case post.Outcome == payment.OutcomeSuccess:
				require.Equal(t, payment.OutcomeHoldClosed, v.Outcome)
				require.Equal(t, "posted", status)
				require.Equal(t, "p", by)
				require.Equal(t, []string{"withdrawal -30"}, f.journal("p"))
				require.Equal(t, "70", f.balance(1, "ETH").String())
			case v.Outcome == payment.OutcomeSuccess:
				require.Equal(t, payment.OutcomeHoldClosed, post.Outcome)
				require.Equal(t, "voided", status)
				require.Equal(t, "v", by)
				require.Empty(t, f.journal("p"))
				require.Equal(t, "100", f.balance(1, "ETH").String())
			default:
				t.Fatalf("post %s, void %s", post.Outcome, v.Outcome)
			}
			require.Equal(t, "0", f.held(1, "ETH"))
			require.LessOrEqual(t, f.count(`SELECT count(*) FROM balance_events`), 1)
			f.requireInvariants()
		})
	}
}

// TestStaleRecoveryRacingAPost: stale recovery hands a post back to the
// outbox (a new generation) while a worker still applies the old task;
// whichever commits first decides, and the hold is posted once.
func TestStaleRecoveryRacingAPost(t *testing.T) {
	ctx := context.Background()
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			f := newFixture(t)
			f.user(1, map[string]string{"ETH": "100"})
			requireOutcome(t, f.apply(f.holdTask("h", 1, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
			old := f.resolveTask("p", payment.WithdrawalPost, 1, "h", "30")
			other := testenv.OpenDB(t, f.dsn)

			var wg sync.WaitGroup
			start := make(chan struct{})
			var applied postgres.LedgerResult
			var applyErr, recoverErr error
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				applied, applyErr = settleItem(ctx, f.db, postgres.LedgerItem{Event: old})
			}()
			go func() {
				defer wg.Done()
				<-start
				_, recoverErr = other.RecoverStale(ctx, 0, 10, postgres.StaleCursor{}, func(context.Context, postgres.StaleEvent) (postgres.RecoveryAction, string) {
					return postgres.RecoveryRequeue, ""
				})
			}()
			close(start)
			wg.Wait()
			require.NoError(t, applyErr)
			require.NoError(t, recoverErr)

			// The requeued generation, if any, is applied as the next task.
			claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
			require.NoError(t, err)
			for _, c := range claimed {
				r, err := settleItem(ctx, f.db, postgres.LedgerItem{Event: c.Event})
				require.NoError(t, err)
				require.Contains(t, []ledger.ResultKind{postgres.Applied, postgres.AlreadyDone}, r.Kind)
			}
			t.Logf("old task %s", applied.Kind)
			switch applied.Kind {
			case postgres.Applied:
				require.Equal(t, payment.OutcomeSuccess, applied.Outcome)
			case postgres.Stale:
				require.Len(t, claimed, 1, "recovered first: the new generation posts it")
			default:
				t.Fatalf("old task: %s %v", applied.Kind, applied.Err)
			}
			st, outcome := f.status("p")
			require.Equal(t, payment.StatusConfirmed, st)
			require.Equal(t, string(payment.OutcomeSuccess), outcome)
			status, by := f.holdStatus("h")
			require.Equal(t, "posted", status)
			require.Equal(t, "p", by)
			require.Equal(t, []string{"withdrawal -30"}, f.journal("p"))
			require.Equal(t, "70", f.balance(1, "ETH").String())
			require.Equal(t, "0", f.held(1, "ETH"))
			f.requireInvariants()
		})
	}
}
