package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// handoff records what the ingest commit gave it, taking every batch of
// at most max events.
type handoff struct {
	max     int
	taskMax int
	mu      sync.Mutex
	given   []postgres.Claimed
	asked   []int
}

func (h *handoff) Take(n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.asked = append(h.asked, n)
	if n > h.max {
		return 0
	}
	return h.taskMax
}

func (h *handoff) Give(claimed []postgres.Claimed) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.given = append(h.given, claimed...)
}

// givenAtLeast waits for n events given: Give runs after the webhooks
// are answered.
func (h *handoff) givenAtLeast(t *testing.T, n int) []postgres.Claimed {
	t.Helper()
	require.Eventually(t, func() bool { return len(h.claimed()) >= n }, 5*time.Second, time.Millisecond)
	return h.claimed()
}

func (h *handoff) claimed() []postgres.Claimed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]postgres.Claimed(nil), h.given...)
}

// Waits for a NOTIFY on the outbox channel: long when one is expected
// (it was sent at a commit that has returned; only a stalled machine
// delays it), a moment when none is.
const (
	notifyExpected = 5 * time.Second
	notifyNone     = 300 * time.Millisecond
)

// notified waits up to wait for a NOTIFY on the outbox channel.
func notified(t *testing.T, conn *pgx.Conn, wait time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := conn.WaitForNotification(ctx)
	return err == nil
}

func TestIngestHandsATrickleToTheQueueInItsOwnCommit(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	_, err := f.sql.Exec(ctx, "LISTEN "+postgres.OutboxChannel)
	require.NoError(t, err)
	h := &handoff{max: 4, taskMax: 2}
	ingest := postgres.NewIngestWith(f.db, postgres.IngestOptions{BatchMax: 64, InFlightMax: 1, Handoff: h})
	defer ingest.Close()
	deposit := func(id, amount string) postgres.NewEvent {
		return postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec(amount), TraceID: "t-" + id}}
	}

	// One event alone: committed 'enqueued' with its task id, given after
	// COMMIT, and the scheduler is not woken for it.
	inserted, err := ingest.InsertEvent(ctx, deposit("h-1", "1"))
	require.NoError(t, err)
	require.True(t, inserted)
	given := h.givenAtLeast(t, 1)
	require.Len(t, given, 1)
	require.Equal(t, "h-1", given[0].Event.ID)
	require.Equal(t, "t-h-1", given[0].Event.TraceID)
	require.NotEmpty(t, given[0].TaskID)
	require.Zero(t, given[0].Event.Generation)
	status, _ := f.status("h-1")
	require.Equal(t, payment.StatusEnqueued, status)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'h-1' AND task_id = $1`, given[0].TaskID))
	require.False(t, notified(t, f.sql, notifyNone), "a handed event must not wake the scheduler")

	// A duplicate delivery inserts nothing and claims nothing.
	inserted, err = ingest.InsertEvent(ctx, deposit("h-1", "1"))
	require.NoError(t, err)
	require.False(t, inserted)
	require.Len(t, h.claimed(), 1)

	// An event stored 'pending' before (the scheduler's, not this
	// transaction's) stays the scheduler's when a duplicate comes.
	_, err = f.db.InsertEvent(ctx, deposit("p-1", "1"))
	require.NoError(t, err)
	require.True(t, notified(t, f.sql, notifyExpected))
	_, err = ingest.InsertEvent(ctx, deposit("p-1", "1"))
	require.NoError(t, err)
	status, _ = f.status("p-1")
	require.Equal(t, payment.StatusPending, status)
	require.Len(t, h.claimed(), 1)

	// Several at once are cut into tasks of taskMax events.
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ingest.InsertEvent(ctx, deposit(fmt.Sprintf("m-%d", i), "1"))
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	tasks := map[string]int{}
	for _, c := range h.givenAtLeast(t, 4)[1:] {
		tasks[c.TaskID]++
	}
	for id, n := range tasks {
		require.LessOrEqual(t, n, 2, "task %s", id)
	}
	require.Equal(t, 4, f.count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued'`))
}

func TestIngestLeavesABatchAboveTheHandoffPending(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	_, err := f.sql.Exec(ctx, "LISTEN "+postgres.OutboxChannel)
	require.NoError(t, err)
	h := &handoff{max: 0, taskMax: 32} // refuses every batch
	ingest := postgres.NewIngestWith(f.db, postgres.IngestOptions{Handoff: h})
	defer ingest.Close()
	_, err = ingest.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "big", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	require.NoError(t, err)
	status, _ := f.status("big")
	require.Equal(t, payment.StatusPending, status)
	require.Empty(t, h.claimed())
	require.True(t, notified(t, f.sql, notifyExpected), "a pending event wakes the scheduler")
}

func TestReleaseHandedSendsBackOnlyWhatIsStillTheTasks(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "10"})
	ctx := context.Background()
	h := &handoff{max: 8, taskMax: 8}
	ingest := postgres.NewIngestWith(f.db, postgres.IngestOptions{Handoff: h})
	defer ingest.Close()
	for _, id := range []string{"r-1", "r-2"} {
		_, err := ingest.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
		require.NoError(t, err)
	}
	given := h.givenAtLeast(t, 2)
	require.Len(t, given, 2)
	// r-2 is settled by the ledger before the api gives up on its task.
	results := f.apply(given[1].Event)
	require.Len(t, results, 1)
	status, _ := f.status("r-2")
	require.Equal(t, payment.StatusConfirmed, status)

	_, err := f.sql.Exec(ctx, "LISTEN "+postgres.OutboxChannel)
	require.NoError(t, err)
	released, err := f.db.ReleaseHanded(ctx, given)
	require.NoError(t, err)
	require.Equal(t, 1, released)
	require.True(t, notified(t, f.sql, notifyExpected), "the enqueuer is woken for what came back")
	status, _ = f.status("r-1")
	require.Equal(t, payment.StatusPending, status)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'r-1' AND generation = 1 AND task_id IS NULL AND retry_count = 0`))
	status, _ = f.status("r-2")
	require.Equal(t, payment.StatusConfirmed, status)

	// Released twice: nothing moves again.
	released, err = f.db.ReleaseHanded(ctx, given)
	require.NoError(t, err)
	require.Zero(t, released)
	require.Equal(t, "11", f.balance(1, "ETH").String())
}

// tupleCounts reads payment_events' insert and update counters.
func (f *fixture) tupleCounts() (inserted, updated int64) {
	f.t.Helper()
	require.NoError(f.t, f.sql.QueryRow(context.Background(),
		`SELECT n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'payment_events'`).Scan(&inserted, &updated))
	return inserted, updated
}

// TestHandedOffRowsAreWrittenOnce: a handed-off event is inserted
// 'enqueued' under its task, one tuple version; inserting it 'pending'
// and updating it in the same transaction cost a non-HOT update per
// event. The version the insert wrote has the transaction's first
// command id (cmin 0: the statements before it write nothing), which an
// update later in the transaction would have replaced.
func TestHandedOffRowsAreWrittenOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	oneVersion := func(c postgres.Claimed) {
		t.Helper()
		require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events
			WHERE event_id = $1 AND status = 'enqueued' AND task_id = $2 AND xmin = insert_xid::xid AND cmin::text = '0'`, c.Event.ID, c.TaskID),
			"%s: not the version its insert wrote", c.Event.ID)
	}

	// One batch on a pool of one connection, and the table's counters: a
	// backend flushes both together, at once only when told to (else
	// within 10s, PGSTAT_IDLE_INTERVAL).
	u, err := url.Parse(f.dsn)
	require.NoError(t, err)
	params := u.Query()
	params.Set("pool_max_conns", "1")
	u.RawQuery = params.Encode()
	single := testenv.OpenDB(t, u.String())
	insertedBefore, updatedBefore := f.tupleCounts()
	var batch []postgres.NewEvent
	for i := 1; i <= 3; i++ {
		batch = append(batch, postgres.NewEvent{Event: payment.Event{ID: fmt.Sprintf("w-%d", i), Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	}
	_, given, err := single.InsertEventsTogether(ctx, batch, 2)
	require.NoError(t, err)
	require.Len(t, given, 3)
	for _, c := range given {
		oneVersion(c)
	}
	require.NoError(t, single.ForceStatsFlush(ctx))
	require.Eventually(t, func() bool {
		inserted, _ := f.tupleCounts()
		return inserted >= insertedBefore+3
	}, 5*time.Second, 10*time.Millisecond, "the batch's counters never showed")
	insertedAfter, updatedAfter := f.tupleCounts()
	require.Equal(t, insertedBefore+3, insertedAfter)
	require.Equal(t, updatedBefore, updatedAfter, "handed-off rows were updated after their insert")

	// Through the api's ingest.
	h := &handoff{max: 8, taskMax: 2}
	ingest := postgres.NewIngestWith(f.db, postgres.IngestOptions{Handoff: h})
	defer ingest.Close()
	inserted, err := ingest.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "w-0", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	require.NoError(t, err)
	require.True(t, inserted)
	oneVersion(h.givenAtLeast(t, 1)[0])
}

// TestHandoffOfAMixedBatchTakesOnlyTheNewRows: duplicates in a handed-off
// batch of rows the scheduler owns (pending, or claimed under its task)
// are left as they are; only the batch's new rows are enqueued and given,
// in tasks no other statement shares.
func TestHandoffOfAMixedBatchTakesOnlyTheNewRows(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	f.user(2, nil)
	ctx := context.Background()
	deposit := func(id string, user int64) postgres.NewEvent {
		return postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: dec("1.5"), TraceID: "t-" + id}}
	}
	for _, id := range []string{"old-claimed", "old-pending"} {
		_, err := f.db.InsertEvent(ctx, deposit(id, 1))
		require.NoError(t, err)
	}
	claimedBefore, err := f.db.ClaimOutbox(ctx, 1, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimedBefore, 1)
	schedulerTask := claimedBefore[0].TaskID
	owned := claimedBefore[0].Event.ID
	stillPending := map[string]string{"old-claimed": "old-pending", "old-pending": "old-claimed"}[owned]
	var ownedVersion, pendingVersion string
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT (SELECT xmin::text || ctid::text FROM payment_events WHERE event_id = $1),
		(SELECT xmin::text || ctid::text FROM payment_events WHERE event_id = $2)`, owned, stillPending).Scan(&ownedVersion, &pendingVersion))

	batch := []postgres.NewEvent{deposit("new-1", 2), deposit(owned, 1), deposit("new-2", 1), deposit(stillPending, 1), deposit("new-3", 2)}
	inserted, given, err := f.db.InsertEventsTogether(ctx, batch, 2)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, true, false, true}, inserted)
	require.Len(t, given, 3)
	tasks := map[string]int{}
	claimNumbers := map[string]bool{}
	for _, c := range given {
		require.True(t, strings.HasPrefix(c.Event.ID, "new-"), c.Event.ID)
		require.Equal(t, "t-"+c.Event.ID, c.Event.TraceID)
		require.True(t, c.Event.Amount.Equal(dec("1.5")), c.Event.Amount.String())
		require.Equal(t, payment.Deposit, c.Event.Type)
		require.Zero(t, c.Event.Generation)
		require.False(t, c.CreatedAt.IsZero())
		require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'enqueued' AND task_id = $2`, c.Event.ID, c.TaskID))
		tasks[c.TaskID]++
		claimNumbers[strings.Split(c.TaskID, "-")[0]] = true
	}
	require.Len(t, claimNumbers, 1, "one claim number per statement: %v", tasks)
	for id, n := range tasks {
		require.LessOrEqual(t, n, 2, "task %s", id)
	}
	// The scheduler's rows: not one column, not one tuple version changed.
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'enqueued' AND task_id = $2 AND xmin::text || ctid::text = $3`,
		owned, schedulerTask, ownedVersion))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'pending' AND task_id IS NULL AND xmin::text || ctid::text = $2`,
		stillPending, pendingVersion))

	// The next statement's tasks are its own; without a hand-off the rows
	// are 'pending' and nothing is given.
	_, again, err := f.db.InsertEventsTogether(ctx, []postgres.NewEvent{deposit("new-4", 1)}, 2)
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.False(t, claimNumbers[strings.Split(again[0].TaskID, "-")[0]], "task %s reuses a claim number", again[0].TaskID)
	inserted, none, err := f.db.InsertEventsTogether(ctx, []postgres.NewEvent{deposit("new-5", 1), deposit("new-1", 2)}, 0)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false}, inserted)
	require.Empty(t, none)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'new-5' AND status = 'pending' AND task_id IS NULL`))
}

// insertAs inserts event id directly with status and task id (NULL if
// empty), with the columns the other constraints tie to the status, so
// that only the insert guard can refuse it.
func (f *fixture) insertAs(id string, status payment.Status, taskID string) error {
	_, err := f.sql.Exec(context.Background(), `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, status, task_id, outcome, next_check_at)
		VALUES ($1, 'deposit', 1, 'ETH', 1, decode(repeat('00', 32), 'hex'), $2, NULLIF($3, ''),
		        CASE WHEN $2 IN ('confirmed', 'failed') THEN 'success' END, CASE WHEN $2 = 'awaiting_finality' THEN now() END)`,
		id, string(status), taskID)
	return err
}

func requireInsertRefused(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23514", pgErr.Code)
	require.Contains(t, pgErr.Message, "must be inserted as pending", "refused by another constraint: %v", err)
}

func TestInsertGuardRefusesEnqueuedWithoutATask(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	requireInsertRefused(t, f.insertAs("no-task", payment.StatusEnqueued, ""))
	_, err := f.sql.Exec(context.Background(), `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, status, task_id)
		VALUES ('empty-task', 'deposit', 1, 'ETH', 1, decode(repeat('00', 32), 'hex'), 'enqueued', '')`)
	requireInsertRefused(t, err)
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events`))
	require.NoError(t, f.insertAs("with-task", payment.StatusEnqueued, "c1-0"))
	require.NoError(t, f.insertAs("pending", payment.StatusPending, ""))
}

// TestInsertGuardRefusesEveryOtherStatus: no status but 'pending' and
// 'enqueued' may be inserted, with a task id or without, and the query
// checker agrees with the database.
func TestInsertGuardRefusesEveryOtherStatus(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	for _, s := range payment.Statuses {
		err := f.insertAs("as-"+string(s), s, "c1-0")
		require.Equal(t, postgres.InsertableStatus(s), err == nil, "%s: the query checker and the insert guard disagree: %v", s, err)
		if s == payment.StatusPending || s == payment.StatusEnqueued {
			require.NoError(t, err, s)
			continue
		}
		requireInsertRefused(t, err)
		requireInsertRefused(t, f.insertAs("bare-"+string(s), s, ""))
	}
	require.Equal(t, 2, f.count(`SELECT count(*) FROM payment_events`))
}

// TestRedeliveriesTakeNoTransactionID: a commit of nothing but
// redeliveries writes nothing, so it must not take a transaction id,
// which would cost it a commit record and a WAL flush. Forming the row
// for the INSERT evaluates insert_xid's default, pg_current_xact_id(),
// even when ON CONFLICT then drops it; redeliveries must not get that far.
func TestRedeliveriesTakeNoTransactionID(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	var batch []postgres.NewEvent
	for i := 1; i <= 3; i++ {
		batch = append(batch, postgres.NewEvent{Event: payment.Event{ID: fmt.Sprintf("r-%d", i), Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	}
	inserted, _, err := f.db.InsertEventsTogether(ctx, batch, 0)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true}, inserted)

	nextXID := func() int64 {
		var v int64
		require.NoError(t, f.sql.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&v))
		return v
	}
	const rounds = 20
	before := nextXID()
	for range rounds {
		for _, taskMax := range []int{0, 2} { // by the scheduler, and handed off
			again, given, err := f.db.InsertEventsTogether(ctx, batch, taskMax)
			require.NoError(t, err)
			require.Equal(t, []bool{false, false, false}, again)
			require.Empty(t, given)
		}
	}
	// The hand-off's claim number is a sequence, which takes an xid to log
	// itself once every 32 values; nothing else may.
	require.Less(t, nextXID()-before, int64(rounds), "%d commits of redeliveries took transaction ids", 2*rounds)
}
