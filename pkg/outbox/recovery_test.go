package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

type noAlerts struct{}

func (noAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// staleQueue is stale events, claimed and 'enqueued', beside a real asynq
// queue on the test's Redis that holds only the tasks a test enqueues:
// with no worker, an enqueued task stays where the test put it.
type staleQueue struct {
	db        *postgres.DB
	conn      *pgx.Conn
	client    *asynq.Client
	inspector *asynq.Inspector
	claimed   map[string]postgres.Claimed
	// taskIDs are the events' task ids as the database has them.
	taskIDs map[string]string
}

// staleEvents inserts and claims the events ids, each a task of its own,
// and ages them oldest first, all past StaleAfter.
func staleEvents(t *testing.T, ids ...string) *staleQueue {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	for _, id := range ids {
		_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: 1,
			Asset: "ETH", Amount: decimal.RequireFromString("1"), TraceID: "t-" + id}})
		require.NoError(t, err)
	}
	claimed, err := db.ClaimOutbox(ctx, 100, 0, 1)
	require.NoError(t, err)
	require.Len(t, claimed, len(ids))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	for i, id := range ids {
		_, err = conn.Exec(ctx, `UPDATE payment_events SET updated_at = now() - make_interval(mins => $2) WHERE event_id = $1`, id, 60-i)
		require.NoError(t, err)
	}
	q := &staleQueue{db: db, conn: conn, client: asynq.NewClientFromRedisClient(rdb), inspector: asynq.NewInspectorFromRedisClient(rdb),
		claimed: map[string]postgres.Claimed{}, taskIDs: map[string]string{}}
	for _, c := range claimed {
		q.claimed[c.Event.ID] = c
	}
	rows, err := conn.Query(ctx, `SELECT event_id, COALESCE(task_id, '') FROM payment_events`)
	require.NoError(t, err)
	for rows.Next() {
		var id, tid string
		require.NoError(t, rows.Scan(&id, &tid))
		q.taskIDs[id] = tid
	}
	require.NoError(t, rows.Err())
	return q
}

// taskID is the id recovery asks asynq about for the event.
func (q *staleQueue) taskID(eventID string) string {
	if id := q.taskIDs[eventID]; id != "" {
		return id
	}
	return task.TaskID(q.claimed[eventID].Event)
}

// enqueue puts the event's task in the queue as the enqueuer does, under
// the id recovery asks about.
func (q *staleQueue) enqueue(t *testing.T, eventID string, opts ...asynq.Option) *asynq.TaskInfo {
	t.Helper()
	c, ok := q.claimed[eventID]
	require.True(t, ok, "%s was not claimed", eventID)
	tk, taskOpts, err := task.NewPaymentBatch([]postgres.Claimed{c})
	require.NoError(t, err)
	info, err := q.client.Enqueue(tk, append(taskOpts, opts...)...)
	require.NoError(t, err)
	require.Equal(t, q.taskID(eventID), info.ID, "the queue holds %s's task under another id than recovery asks about", eventID)
	return info
}

// recovery asks this queue about batch events a page.
func (q *staleQueue) recovery(batch int) *outbox.Recovery {
	return &outbox.Recovery{Store: q.db, Inspector: q.inspector, Alerts: noAlerts{}, Log: zerolog.Nop(),
		StaleAfter: 3 * time.Minute, MaxAttempts: 10, BatchMax: batch}
}

// staleBehindSlow makes slow stale events, oldest first, whose tasks wait
// (pending) in the queue, then one (lost-1) whose task the queue lost: it
// was never enqueued. It returns a recovery of batch events a page, and a
// connection to look.
func staleBehindSlow(t *testing.T, slow, batch int) (*outbox.Recovery, *pgx.Conn) {
	t.Helper()
	var ids []string
	for i := range slow {
		ids = append(ids, fmt.Sprintf("slow-%02d", i+1))
	}
	q := staleEvents(t, append(ids, "lost-1")...)
	for _, id := range ids {
		require.Equal(t, asynq.TaskStatePending, q.enqueue(t, id).State)
	}
	_, err := q.inspector.GetTaskInfo(task.QueuePayments, q.taskID("lost-1"))
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
	return q.recovery(batch), q.conn
}

func status(t *testing.T, conn *pgx.Conn, id string) string {
	t.Helper()
	var s string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT status FROM payment_events WHERE event_id = $1`, id).Scan(&s))
	return s
}

// TestRecoveryReachesALostEventBehindSlowOnes: stale recovery recovers an
// event whose task the queue lost even when BatchMax or more older stale
// events still have their (slow) tasks waiting in the queue. Those keep
// their updated_at, so reading the oldest BatchMax each pass, and
// stopping at a page all skipped, never got past them.
func TestRecoveryReachesALostEventBehindSlowOnes(t *testing.T) {
	const batch = 3
	r, conn := staleBehindSlow(t, batch, batch)
	require.NoError(t, r.Run(context.Background()))
	for i := range batch {
		id := fmt.Sprintf("slow-%02d", i+1)
		require.Equal(t, "enqueued", status(t, conn, id), "%s's task is waiting in the queue: left alone", id)
	}
	require.Equal(t, "pending", status(t, conn, "lost-1"), "the event whose task the queue lost was never recovered")
}

// TestRecoveryGoesOnAfterItsPageBound: a run reads at most
// RecoveryPagesPerRunMax pages; the next run goes on after the last one
// rather than from the oldest again, so the lost event behind more slow
// ones than a run reads is still reached.
func TestRecoveryGoesOnAfterItsPageBound(t *testing.T) {
	const batch = 1
	r, conn := staleBehindSlow(t, outbox.RecoveryPagesPerRunMax+1, batch)
	require.NoError(t, r.Run(context.Background()))
	require.Equal(t, "enqueued", status(t, conn, "lost-1"), "one run read more than its page bound")
	require.NoError(t, r.Run(context.Background()))
	require.Equal(t, "pending", status(t, conn, "lost-1"), "the next run started from the oldest again")
}

// TestRecoveryJudgesATaskByItsStateInTheQueue: a stale event whose task
// the queue still holds to run (pending, scheduled) is slow and left
// alone; one whose task asynq archived (it gave up silently) or does not
// have is recovered. (Active tasks: recovery_lease_test.go.)
func TestRecoveryJudgesATaskByItsStateInTheQueue(t *testing.T) {
	ctx := context.Background()
	q := staleEvents(t, "pending-1", "scheduled-1", "archived-1", "absent-1")
	q.enqueue(t, "pending-1")
	q.enqueue(t, "scheduled-1", asynq.ProcessIn(time.Hour))
	q.enqueue(t, "archived-1")
	require.NoError(t, q.inspector.ArchiveTask(task.QueuePayments, q.taskID("archived-1")))
	for id, want := range map[string]asynq.TaskState{
		"pending-1": asynq.TaskStatePending, "scheduled-1": asynq.TaskStateScheduled, "archived-1": asynq.TaskStateArchived,
	} {
		info, err := q.inspector.GetTaskInfo(task.QueuePayments, q.taskID(id))
		require.NoError(t, err)
		require.Equal(t, want, info.State, id)
	}
	_, err := q.inspector.GetTaskInfo(task.QueuePayments, q.taskID("absent-1"))
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)

	require.NoError(t, q.recovery(10).Run(ctx))
	require.Equal(t, "enqueued", status(t, q.conn, "pending-1"), "a task waiting in the queue was taken for lost")
	require.Equal(t, "enqueued", status(t, q.conn, "scheduled-1"), "a task scheduled in the queue was taken for lost")
	require.Equal(t, "pending", status(t, q.conn, "archived-1"), "a task asynq archived was left alone")
	require.Equal(t, "pending", status(t, q.conn, "absent-1"), "a task the queue lost was left alone")
}
