package task_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

func TestPaymentBatchRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	claimed := []postgres.Claimed{
		{TaskID: "c7-0", CreatedAt: at, Event: payment.Event{ID: "a", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("0.000000000000000001"), TraceID: "t1"}},
		{TaskID: "c7-0", CreatedAt: at, Event: payment.Event{ID: "b", Type: payment.Withdrawal, UserID: 2, Asset: "USDT", Amount: decimal.RequireFromString("12.5"), Generation: 3, TxHash: "0xab"}},
	}
	built, _, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	tasks, events, err := task.DecodePaymentTask(built.Payload())
	require.NoError(t, err)
	require.Len(t, events, 2)
	for i, c := range claimed {
		require.Equal(t, c.Event.ID, events[i].ID)
		require.True(t, c.Event.Amount.Equal(events[i].Amount))
		require.Equal(t, c.Event.Generation, events[i].Generation)
		require.Equal(t, at, tasks[i].AcceptedAt.UTC())
	}

	_, _, err = task.NewPaymentBatch([]postgres.Claimed{claimed[0], {TaskID: "c8-0", Event: claimed[1].Event}})
	require.Error(t, err, "events of two tasks")
	_, _, err = task.NewPaymentBatch([]postgres.Claimed{{Event: claimed[0].Event}, {Event: claimed[1].Event}})
	require.Error(t, err, "several events need a task id")
	_, _, err = task.NewPaymentBatch(nil)
	require.Error(t, err)
}

func TestDecodePaymentTaskRefusesMalformedPayloads(t *testing.T) {
	for name, body := range map[string]string{
		"not json":          `{`,
		"no events":         `{"events":[]}`,
		"event without id":  `{"events":[{"event_type":"deposit","amount":"1"}]}`,
		"bad amount":        `{"events":[{"event_id":"x","event_type":"deposit","amount":"1e"}]}`,
		"single without id": `{"event_type":"deposit","amount":"1"}`,
	} {
		_, _, err := task.DecodePaymentTask([]byte(body))
		require.ErrorIs(t, err, payment.ErrInvalid, name)
	}
	// A task enqueued before batches existed is one event.
	_, events, err := task.DecodePaymentTask([]byte(`{"event_id":"old","event_type":"deposit","user_id":1,"asset":"ETH","amount":"1","generation":0}`))
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, "old", events[0].ID)
}

// FuzzDecodePaymentTask: whatever Redis hands the worker, decoding either
// refuses it as invalid or yields as many well-formed events as entries,
// and what it yields encodes as a batch that decodes to the same.
func FuzzDecodePaymentTask(f *testing.F) {
	f.Add([]byte(`{"events":[{"event_id":"a","event_type":"deposit","user_id":1,"asset":"ETH","amount":"1.5","generation":2}]}`))
	f.Add([]byte(`{"event_id":"old","event_type":"deposit","amount":"1"}`))
	f.Add([]byte(`{"events":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		tasks, events, err := task.DecodePaymentTask(body)
		if err != nil {
			require.ErrorIs(t, err, payment.ErrInvalid)
			return
		}
		require.Len(t, events, len(tasks))
		require.NotEmpty(t, events)
		for i, e := range events {
			require.NotEmpty(t, e.ID)
			require.Equal(t, tasks[i].EventID, e.ID)
		}
		again, err := json.Marshal(task.PaymentBatch{Events: tasks})
		require.NoError(t, err)
		tasks2, events2, err := task.DecodePaymentTask(again)
		require.NoError(t, err, "re-encoded %s", again)
		require.Len(t, tasks2, len(tasks))
		for i := range tasks {
			// The instant, not its *time.Location, is the content.
			require.True(t, tasks[i].AcceptedAt.Equal(tasks2[i].AcceptedAt), "accepted_at of %d", i)
			tasks[i].AcceptedAt, tasks2[i].AcceptedAt = time.Time{}, time.Time{}
		}
		require.Equal(t, tasks, tasks2)
		require.Equal(t, events, events2)
	})
}
