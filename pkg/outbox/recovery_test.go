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
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

// queueHolding answers GetTaskInfo: tasks in `waiting` are pending in the
// queue (slow, not lost); any other task is missing (lost).
type queueHolding struct{ waiting map[string]bool }

func (q queueHolding) GetTaskInfo(queue, id string) (*asynq.TaskInfo, error) {
	if q.waiting[id] {
		return &asynq.TaskInfo{ID: id, Queue: queue, State: asynq.TaskStatePending}, nil
	}
	return nil, asynq.ErrTaskNotFound
}

type noAlerts struct{}

func (noAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// staleBehindSlow enqueues slow stale events, oldest first, whose tasks
// wait in the queue, then one (lost-1) whose task the queue lost. It
// returns a recovery of batch events a page, and a connection to look.
func staleBehindSlow(t *testing.T, slow, batch int) (*outbox.Recovery, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	var ids []string
	for i := range slow {
		ids = append(ids, fmt.Sprintf("slow-%02d", i+1))
	}
	ids = append(ids, "lost-1")
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
	taskIDs := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT event_id, COALESCE(task_id, '') FROM payment_events`)
	require.NoError(t, err)
	for rows.Next() {
		var id, tid string
		require.NoError(t, rows.Scan(&id, &tid))
		taskIDs[id] = tid
	}
	require.NoError(t, rows.Err())
	waiting := map[string]bool{}
	for _, c := range claimed {
		if c.Event.ID != "lost-1" {
			id := taskIDs[c.Event.ID]
			if id == "" {
				id = task.TaskID(c.Event)
			}
			waiting[id] = true
		}
	}
	return &outbox.Recovery{Store: db, Inspector: queueHolding{waiting: waiting}, Alerts: noAlerts{}, Log: zerolog.Nop(),
		StaleAfter: 3 * time.Minute, MaxAttempts: 10, BatchMax: batch}, conn
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
