package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// deadLetter fails a claimed event the way the worker does when its
// retries run out, returning the DLQ entry's id.
func (f *fixture) deadLetter(task payment.Event, why string) int64 {
	f.t.Helper()
	moved, id, err := f.db.FailToDLQ(context.Background(), payment.DeadLetter{
		EventID: task.ID, EventType: string(task.Type), UserID: task.UserID, Asset: task.Asset, Amount: task.Amount.String(),
		Error: why, Attempt: 6, Generation: task.Generation, Source: payment.SourceWorker, TraceID: task.TraceID,
	})
	require.NoError(f.t, err)
	require.True(f.t, moved)
	return id
}

func TestReplayedTwiceCreditsOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("dl-1", payment.Deposit, 1, "ETH", "2")
	id := f.deadLetter(task, "retries exhausted")
	status, outcome := f.status("dl-1")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, "dead_lettered", outcome)

	result, err := f.db.ReplayDeadLetter(ctx, id, "alice", "chain was down")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, result)
	again, err := f.db.ReplayDeadLetter(ctx, id, "bob", "")
	require.NoError(t, err)
	require.Equal(t, postgres.AlreadyReplayed, again)

	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, task.Generation+1, claimed[0].Event.Generation, "a new generation, so a new task id")
	f.apply(claimed[0].Event)
	f.apply(claimed[0].Event)
	require.True(t, f.balance(1, "ETH").Equal(dec("2")))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id='dl-1'`))

	entry, err := f.db.DeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "replayed", entry.Resolution)
	require.Equal(t, "alice", entry.ResolvedBy)
	require.Equal(t, "chain was down", entry.Reason)
	require.NotNil(t, entry.ResolvedAt)
	require.Equal(t, "confirmed", entry.EventStatus)
	f.requireJournalInvariant()
}

func TestReplayOfASettledEventIsSuperseded(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("dl-2", payment.Deposit, 1, "ETH", "1")
	first := f.deadLetter(task, "attempt one")
	_, err := f.db.ReplayDeadLetter(ctx, first, "alice", "")
	require.NoError(t, err)
	// A second row for the same failure (another failed attempt, drained
	// late from the Redis fallback, after the replay closed the others).
	ids, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: "dl-2", EventType: "deposit", Error: "attempt two", Source: payment.SourceDrain}})
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	f.apply(claimed[0].Event)

	result, err := f.db.ReplayDeadLetter(ctx, ids[0], "bob", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Superseded, result)
	require.True(t, f.balance(1, "ETH").Equal(dec("1")), "credited once")
	open, err := f.db.DeadLetters(ctx, "open", 0, 10)
	require.NoError(t, err)
	require.Empty(t, open)
}

func TestDiscardedEntryCannotBeReplayed(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "10"})
	ctx := context.Background()
	id := f.deadLetter(f.enqueue("dl-3", payment.Withdrawal, 1, "ETH", "1"), "bad")

	_, err := f.db.DiscardDeadLetter(ctx, id, "alice", "")
	require.ErrorIs(t, err, payment.ErrInvalid, "a reason is required")
	changed, err := f.db.DiscardDeadLetter(ctx, id, "alice", "duplicate of a manual refund")
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = f.db.DiscardDeadLetter(ctx, id, "alice", "again")
	require.NoError(t, err)
	require.False(t, changed, "idempotent")
	_, err = f.db.ReplayDeadLetter(ctx, id, "bob", "")
	require.ErrorIs(t, err, postgres.ErrDiscarded)
	require.True(t, f.balance(1, "ETH").Equal(dec("10")))
	status, _ := f.status("dl-3")
	require.Equal(t, payment.StatusFailed, status)

	resolved, err := f.db.DeadLetters(ctx, "resolved", 0, 10)
	require.NoError(t, err)
	require.Len(t, resolved, 1)
	require.Equal(t, "discarded", resolved[0].Resolution)
	require.Equal(t, "duplicate of a manual refund", resolved[0].Reason)
}

// TestDiscardIsAboutTheEvent: a withdrawal with two open entries for one
// failure (a second attempt's, a copy drained from the fallback list). A
// discard of one closes the other, and a copy drained after the discard
// replays nothing either: a replay of a sibling entry debited a
// withdrawal an operator had discarded. Racing a replay of one entry
// against a discard of the other, exactly one of them wins.
func TestDiscardIsAboutTheEvent(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "10"})
	ctx := context.Background()
	task := f.enqueue("wd-twice", payment.Withdrawal, 1, "ETH", "4")
	first := f.deadLetter(task, "retries exhausted")
	letter := payment.DeadLetter{EventID: task.ID, EventType: string(task.Type), Error: "attempt two", Generation: task.Generation, Source: payment.SourceDrain}
	sibling, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{letter})
	require.NoError(t, err)

	changed, err := f.db.DiscardDeadLetter(ctx, first, "alice", "fraudulent: never process")
	require.NoError(t, err)
	require.True(t, changed)
	entry, err := f.db.DeadLetter(ctx, sibling[0])
	require.NoError(t, err)
	require.Equal(t, "discarded", entry.Resolution, "closed with the first")
	require.Equal(t, "alice", entry.ResolvedBy)
	_, err = f.db.ReplayDeadLetter(ctx, sibling[0], "bob", "")
	require.ErrorIs(t, err, postgres.ErrDiscarded)

	late, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{letter})
	require.NoError(t, err)
	_, err = f.db.ReplayDeadLetter(ctx, late[0], "bob", "")
	require.ErrorIs(t, err, postgres.ErrDiscarded, "a copy of the discarded failure drained late")
	status, _ := f.status("wd-twice")
	require.Equal(t, payment.StatusFailed, status)
	require.True(t, f.balance(1, "ETH").Equal(dec("10")), "nothing debited")

	reopened := 0
	for i := range 20 {
		id := fmt.Sprintf("wd-race-%d", i)
		task := f.enqueue(id, payment.Withdrawal, 1, "ETH", "0.1")
		one := f.deadLetter(task, "retries exhausted")
		other, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: id, EventType: string(task.Type), Error: "copy", Generation: task.Generation, Source: payment.SourceDrain}})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var replayErr, discardErr error
		var replayed postgres.ReplayResult
		var discarded bool
		wg.Add(2)
		go func() { defer wg.Done(); replayed, replayErr = f.db.ReplayDeadLetter(ctx, other[0], "bob", "") }()
		go func() { defer wg.Done(); discarded, discardErr = f.db.DiscardDeadLetter(ctx, one, "alice", "never") }()
		wg.Wait()
		status, _ := f.status(id)
		if replayErr == nil {
			require.Equal(t, postgres.Reopened, replayed, "the replay came first")
			require.ErrorIs(t, discardErr, postgres.ErrReplayed, "so the discard is refused, not told it discarded")
			require.False(t, discarded)
			require.NotEqual(t, payment.StatusFailed, status)
			entry, err := f.db.DeadLetter(ctx, one)
			require.NoError(t, err)
			require.Equal(t, "replayed", entry.Resolution, "closed with its sibling")
			f.apply(f.enqueueClaimed(id))
			reopened++
			continue
		}
		require.NoError(t, discardErr)
		require.True(t, discarded)
		require.ErrorIs(t, replayErr, postgres.ErrDiscarded, "the discard came first")
		require.Equal(t, payment.StatusFailed, status)
	}
	// The replayed withdrawals are debited once each; the discarded none.
	t.Logf("replay won %d of 20 races", reopened)
	require.True(t, f.balance(1, "ETH").Equal(dec("10").Sub(dec("0.1").Mul(decimal.NewFromInt(int64(reopened))))))
	require.Equal(t, reopened, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id LIKE 'wd-race-%'`))
	require.Zero(t, f.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id LIKE 'wd-race-%' AND resolution IS NULL`))
}

// TestDiscardOfAReplayedFailuresLateCopy: a copy of a failure drained
// after that failure was replayed is still open, but the event runs
// again: discarding it is refused (it would answer "discarded" for an
// event that is debited), and replaying it closes it as superseded.
func TestDiscardOfAReplayedFailuresLateCopy(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "10"})
	ctx := context.Background()
	task := f.enqueue("wd-late", payment.Withdrawal, 1, "ETH", "4")
	first := f.deadLetter(task, "retries exhausted")
	result, err := f.db.ReplayDeadLetter(ctx, first, "bob", "node was down")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, result)
	late, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: task.ID, EventType: string(task.Type), Error: "drained late",
		Generation: task.Generation, Source: payment.SourceDrain}})
	require.NoError(t, err)
	changed, err := f.db.DiscardDeadLetter(ctx, late[0], "alice", "never")
	require.ErrorIs(t, err, postgres.ErrFailureReplayed)
	require.False(t, changed)
	status, _ := f.status("wd-late")
	require.Equal(t, payment.StatusPending, status, "the replay stands")
	result, err = f.db.ReplayDeadLetter(ctx, late[0], "alice", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Superseded, result)
}

func TestReplayedEntryCannotBeDiscardedAndOrphansCannotBeReplayed(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	id := f.deadLetter(f.enqueue("dl-4", payment.Deposit, 1, "ETH", "1"), "x")
	_, err := f.db.ReplayDeadLetter(ctx, id, "alice", "")
	require.NoError(t, err)
	_, err = f.db.DiscardDeadLetter(ctx, id, "bob", "changed my mind")
	require.ErrorIs(t, err, postgres.ErrReplayed)

	orphan, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: "task-123", EventType: "payment:refund", Error: "unknown task type", Source: payment.SourceWorker}})
	require.NoError(t, err)
	_, err = f.db.ReplayDeadLetter(ctx, orphan[0], "alice", "")
	require.ErrorIs(t, err, postgres.ErrNoEvent)
	_, err = f.db.ReplayDeadLetter(ctx, 99999, "alice", "")
	require.ErrorIs(t, err, payment.ErrNotFound)
}

func TestReplayOfAnUncoveredCompensation(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	f.apply(f.enqueue("dep", payment.Deposit, 1, "ETH", "5"))
	f.apply(f.enqueue("spent", payment.Withdrawal, 1, "ETH", "5"))
	_, err := f.db.ReverseDeposit(ctx, "dep", "reorg", "")
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	results := f.apply(claimed[0].Event)
	require.Equal(t, payment.OutcomeDeadLettered, results[0].Outcome)

	// The user deposits again; a human settles the compensation.
	f.apply(f.enqueue("dep-2", payment.Deposit, 1, "ETH", "5"))
	result, err := f.db.ReplayDeadLetter(ctx, results[0].DeadLetterID, "alice", "user topped up")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, result)
	claimed, err = f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	results = f.apply(claimed[0].Event)
	require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	require.True(t, f.balance(1, "ETH").IsZero())
	f.requireJournalInvariant()
}

// TestUncoveredCompensationSeenAgainAlerts: the attempt that dead-lettered
// an uncovered reorg compensation owes a critical alert; when its answer
// was lost (a commit the connection dropped after, a worker gone) the
// retry finds the event done, and says the alert again instead of
// nothing.
func TestUncoveredCompensationSeenAgainAlerts(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	f.apply(f.enqueue("dep", payment.Deposit, 1, "ETH", "5"))
	f.apply(f.enqueue("spent", payment.Withdrawal, 1, "ETH", "4"))
	_, err := f.db.ReverseDeposit(ctx, "dep", "reorg", "")
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	first := f.apply(claimed[0].Event)
	require.Equal(t, payment.OutcomeDeadLettered, first[0].Outcome)
	require.NotEmpty(t, first[0].Alert)

	again := f.apply(claimed[0].Event)
	require.Equal(t, postgres.AlreadyDone, again[0].Kind)
	require.Contains(t, again[0].Alert, "settle by hand")
	done := f.apply(f.enqueue("other", payment.Deposit, 1, "ETH", "1"))
	again = f.apply(done[0].Event)
	require.Equal(t, postgres.AlreadyDone, again[0].Kind)
	require.Empty(t, again[0].Alert, "only an uncovered compensation owes one")
}

// TestReplayOfAnOlderEntryLeavesANewerFailure: an event with two entries
// for its failure in one generation (written before letters carried
// their key) is replayed through one, which closes the other, and fails
// again in the next generation. Replaying the other old entry answers
// already replayed, a copy of the old failure drained late superseded,
// and both leave the new failure alone; only its own entry reopens it.
func TestReplayOfAnOlderEntryLeavesANewerFailure(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("dl-gen", payment.Deposit, 1, "ETH", "3")
	first := f.deadLetter(task, "attempt one")
	copies, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: task.ID, EventType: string(task.Type), Error: "attempt one, again",
		Generation: task.Generation, Source: payment.SourceDrain}})
	require.NoError(t, err)
	result, err := f.db.ReplayDeadLetter(ctx, first, "alice", "node was down")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, result)

	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	newer := f.deadLetter(claimed[0].Event, "attempt two")
	generation := f.count(`SELECT generation FROM payment_events WHERE event_id = 'dl-gen'`)

	old, err := f.db.DeadLetter(ctx, copies[0])
	require.NoError(t, err)
	require.Equal(t, "replayed", old.Resolution, "closed with the failure it records")
	require.Equal(t, fmt.Sprintf("replayed through entry %d", first), old.Reason)
	result, err = f.db.ReplayDeadLetter(ctx, copies[0], "bob", "")
	require.NoError(t, err)
	require.Equal(t, postgres.AlreadyReplayed, result, "the old entry's failure was replayed already")
	status, outcome := f.status("dl-gen")
	require.Equal(t, payment.StatusFailed, status, "the newer failure stays for its own entry")
	require.Equal(t, "dead_lettered", outcome)
	require.Equal(t, generation, f.count(`SELECT generation FROM payment_events WHERE event_id = 'dl-gen'`))
	open, err := f.db.DeadLetter(ctx, newer)
	require.NoError(t, err)
	require.Empty(t, open.Resolution)

	// A discard of the new failure does not make the old entry's replay
	// a conflict either: it is superseded all the same.
	changed, err := f.db.DiscardDeadLetter(ctx, newer, "carol", "refunded by hand")
	require.NoError(t, err)
	require.True(t, changed)
	late, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: task.ID, EventType: string(task.Type), Error: "drained late",
		Generation: task.Generation, Source: payment.SourceDrain}})
	require.NoError(t, err)
	result, err = f.db.ReplayDeadLetter(ctx, late[0], "bob", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Superseded, result)
	status, _ = f.status("dl-gen")
	require.Equal(t, payment.StatusFailed, status)

	_, err = f.db.ReplayDeadLetter(ctx, newer, "bob", "")
	require.ErrorIs(t, err, postgres.ErrDiscarded)
	require.True(t, f.balance(1, "ETH").IsZero())
}

// TestDeadLetterIDsOfOneCallSharingAKey: of two letters with one key in
// one call (the ledger's read of insert_dlq), the first is stored (ON
// CONFLICT skips the second, in order) and the id is the first's;
// letters without a key keep theirs.
func TestDeadLetterIDsOfOneCallSharingAKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	letter := func(key, errText string) payment.DeadLetter {
		return payment.DeadLetter{EventID: "dup-1", EventType: "deposit", Error: errText, Source: payment.SourceDrain, FallbackID: key}
	}
	ids, err := f.db.InsertDeadLettersByLetter(ctx, []payment.DeadLetter{
		letter("", "keyless before"), letter("k-dup", "first"), letter("k-dup", "second"), letter("", "keyless after"),
	})
	require.NoError(t, err)
	require.Len(t, ids, 4)
	require.NotZero(t, ids[0])
	require.NotZero(t, ids[1], "the first letter of a key is the one stored")
	require.Zero(t, ids[2], "the second of the key was skipped")
	require.NotZero(t, ids[3])
	var stored string
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT error FROM dead_letter_queue WHERE id = $1`, ids[1]).Scan(&stored))
	require.Equal(t, "first", stored)
}
