package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
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

// notified waits a moment for a NOTIFY on the outbox channel.
func notified(t *testing.T, conn *pgx.Conn) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
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
	require.False(t, notified(t, f.sql), "a handed event must not wake the scheduler")

	// A duplicate delivery inserts nothing and claims nothing.
	inserted, err = ingest.InsertEvent(ctx, deposit("h-1", "1"))
	require.NoError(t, err)
	require.False(t, inserted)
	require.Len(t, h.claimed(), 1)

	// An event stored 'pending' before (the scheduler's, not this
	// transaction's) stays the scheduler's when a duplicate comes.
	_, err = f.db.InsertEvent(ctx, deposit("p-1", "1"))
	require.NoError(t, err)
	require.True(t, notified(t, f.sql))
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
	require.True(t, notified(t, f.sql), "a pending event wakes the scheduler")
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
	require.True(t, notified(t, f.sql), "the enqueuer is woken for what came back")
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
