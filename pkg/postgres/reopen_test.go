package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const reopenTxHash = "0x00000000000000000000000000000000000000000000000000000000000000aa"

// chainDeposit accepts a deposit naming a transaction and claims it.
func (f *fixture) chainDeposit(id string, user int64, amount string) payment.Event {
	f.t.Helper()
	ctx := context.Background()
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: dec(amount), TxHash: reopenTxHash, TraceID: "trace-" + id}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	return f.claim(id)
}

// claim runs the enqueuer's claim (pending and due waiting events) and
// returns id's task.
func (f *fixture) claim(id string) payment.Event {
	f.t.Helper()
	claimed, err := f.db.ClaimOutbox(context.Background(), 1000, 1000, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	for _, c := range claimed {
		if c.Event.ID == id {
			return c.Event
		}
	}
	f.t.Fatalf("event %s was not claimed", id)
	return payment.Event{}
}

// failedByChain is a deposit the chain decided against.
func (f *fixture) failedByChain(id string, outcome payment.Outcome) payment.Event {
	f.t.Helper()
	task := f.chainDeposit(id, 1, "3")
	moved, err := f.db.DecideChainOutcome(context.Background(), task, outcome, "the chain said no")
	require.NoError(f.t, err)
	require.True(f.t, moved)
	return task
}

func (f *fixture) keyOutcome(id string) string {
	f.t.Helper()
	var outcome string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT outcome FROM processed_events WHERE idempotency_key = $1`,
		payment.IdempotencyKey(id, payment.Deposit)).Scan(&outcome))
	return outcome
}

// TestReopenedDepositIsAFirstAttempt: a failed/reorged deposit reopens once,
// as a new generation with its chain history forgotten and its finality
// clock restarted, its idempotency record saying reopened; the ledger then
// credits it once.
func TestReopenedDepositIsAFirstAttempt(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.failedByChain("ro-1", payment.OutcomeReorged)
	require.Equal(t, "reorged", f.keyOutcome("ro-1"))
	// Old enough that its first finality clock ran out long ago.
	_, err := f.sql.Exec(ctx, `UPDATE payment_events SET created_at = now() - interval '3 hours', receipt_seen_at = now(), check_count = 7 WHERE event_id = 'ro-1'`)
	require.NoError(t, err)

	reopened, err := f.db.ReopenDeposit(ctx, "ro-1", []payment.Outcome{payment.OutcomeNotFound}, "wrong outcome")
	require.NoError(t, err)
	require.False(t, reopened, "only the outcomes named reopen")
	reopened, err = f.db.ReopenDeposit(ctx, "ro-1", []payment.Outcome{payment.OutcomeReorged}, "alchemy re-added it")
	require.NoError(t, err)
	require.True(t, reopened)
	again, err := f.db.ReopenDeposit(ctx, "ro-1", []payment.Outcome{payment.OutcomeReorged}, "alchemy re-added it")
	require.NoError(t, err)
	require.False(t, again, "a pending deposit does not reopen")

	status, outcome := f.status("ro-1")
	require.Equal(t, payment.StatusPending, status)
	require.Empty(t, outcome)
	require.Equal(t, "reopened", f.keyOutcome("ro-1"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'ro-1' AND generation = $1 AND retry_count = 0
		AND receipt_seen_at IS NULL AND chain_state IS NULL AND check_count = 0 AND next_check_at IS NULL AND reopened_at IS NOT NULL`, task.Generation+1))
	wait, err := f.db.ChainWait(ctx, "ro-1")
	require.NoError(t, err)
	require.Less(t, wait.Age, time.Minute, "the finality clock counts from the reopening")
	require.False(t, wait.ReceiptSeen)

	retry := f.claim("ro-1")
	require.Equal(t, task.Generation+1, retry.Generation)
	f.apply(task) // the old generation's task does nothing
	f.apply(retry)
	f.apply(retry)
	status, outcome = f.status("ro-1")
	require.Equal(t, payment.StatusConfirmed, status)
	require.Equal(t, "success", outcome)
	require.True(t, f.balance(1, "ETH").Equal(dec("3")))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'ro-1' AND amount = 3`))
	f.requireJournalInvariant()

	confirmed, err := f.db.ReopenDeposit(ctx, "ro-1", payment.RecheckOutcomes, "again")
	require.NoError(t, err)
	require.False(t, confirmed, "a confirmed deposit does not reopen")
}

func TestReopenRefusesWhatTheChainCannotChange(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	// A deposit without a transaction, voided by its provider.
	f.enqueue("ro-notx", payment.Deposit, 1, "ETH", "1")
	_, err := f.db.ReverseDeposit(ctx, "ro-notx", "removed", "")
	require.NoError(t, err)
	reopened, err := f.db.ReopenDeposit(ctx, "ro-notx", []payment.Outcome{payment.OutcomeReorged}, "")
	require.NoError(t, err)
	require.False(t, reopened, "no transaction: nothing on the chain can change its fate")
	status, outcome := f.status("ro-notx")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, "reorged", outcome)

	_, err = f.db.ReopenDeposit(ctx, "ro-missing", []payment.Outcome{payment.OutcomeReorged}, "")
	require.ErrorIs(t, err, payment.ErrNotFound)
}

func TestHurryFinalityCheck(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.chainDeposit("hurry-1", 1, "1")
	h, err := f.db.HurryFinalityCheck(ctx, "hurry-1")
	require.NoError(t, err)
	require.Equal(t, postgres.Hurry{Type: payment.Deposit, Status: payment.StatusEnqueued}, h, "in flight: nothing to hurry")

	moved, err := f.db.AwaitFinality(ctx, task, postgres.Wait{RecheckIn: time.Hour})
	require.NoError(t, err)
	require.True(t, moved)
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'hurry-1' AND next_check_at <= now()`))
	h, err = f.db.HurryFinalityCheck(ctx, "hurry-1")
	require.NoError(t, err)
	require.True(t, h.Hurried)
	require.Equal(t, payment.StatusAwaitingFinality, h.Status)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'hurry-1' AND next_check_at <= now()`))
	require.Equal(t, "hurry-1", f.claim("hurry-1").ID, "due now: the enqueuer takes it")

	_, err = f.db.HurryFinalityCheck(ctx, "hurry-missing")
	require.ErrorIs(t, err, payment.ErrNotFound)
}

// TestRecordRecheck: a recheck is recorded with who and what the chain
// showed; one that reopens does so once, a second finds nothing to do.
func TestRecordRecheck(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	f.failedByChain("rc-1", payment.OutcomeNotFound)

	_, err := f.db.RecordRecheck(ctx, postgres.Recheck{EventID: "rc-1", ChainState: "wait"}, false)
	require.ErrorIs(t, err, payment.ErrInvalid, "nobody asked")

	unchanged, err := f.db.RecordRecheck(ctx, postgres.Recheck{EventID: "rc-1", RequestedBy: "alice", ChainState: "wait", Result: postgres.RecheckUnchanged, Detail: "no receipt"}, false)
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckUnchanged, unchanged.Result)
	require.Equal(t, payment.StatusFailed, unchanged.Status)
	require.NotZero(t, unchanged.ID)

	first, err := f.db.RecordRecheck(ctx, postgres.Recheck{EventID: "rc-1", RequestedBy: "bob", ChainState: "credit", Detail: "final in block 9"}, true)
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckReopened, first.Result)
	require.Equal(t, payment.StatusPending, first.Status)
	second, err := f.db.RecordRecheck(ctx, postgres.Recheck{EventID: "rc-1", RequestedBy: "bob", ChainState: "credit", Detail: "final in block 9"}, true)
	require.NoError(t, err)
	require.Equal(t, postgres.RecheckNotApplicable, second.Result)
	require.Contains(t, second.Detail, "moved on")

	history, err := f.db.Rechecks(ctx, "rc-1")
	require.NoError(t, err)
	require.Len(t, history, 3)
	require.Equal(t, "alice", history[0].RequestedBy)
	require.Equal(t, "wait", history[0].ChainState)
	require.Equal(t, postgres.RecheckReopened, history[1].Result)
	require.Equal(t, "bob", history[2].RequestedBy)
	require.Equal(t, "reopened", f.keyOutcome("rc-1"))
	require.Contains(t, f.eventError("rc-1"), "recheck by bob", "while it waits, the event says why it is back")
}

func (f *fixture) eventError(id string) string {
	f.t.Helper()
	var text *string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT error FROM payment_events WHERE event_id = $1`, id).Scan(&text))
	if text == nil {
		return ""
	}
	return *text
}

func TestTransferClaims(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.sql.Exec(ctx, `INSERT INTO chain_transfers (network, tx_hash, transfer_index, asset, event_id) VALUES
		('ETH_MAINNET', $1, '3', 'ETH', 'a'), ('ETH_MAINNET', $1, 'native', 'ETH', 'b'), ('BASE_MAINNET', $1, '4', 'ETH', 'c')`, reopenTxHash)
	require.NoError(t, err)
	claims, err := f.db.TransferClaims(ctx, "ETH_MAINNET", reopenTxHash)
	require.NoError(t, err)
	require.Equal(t, []postgres.TransferClaim{{Index: "3", EventID: "a", Asset: "ETH"}, {Index: "native", EventID: "b", Asset: "ETH"}}, claims)
}
