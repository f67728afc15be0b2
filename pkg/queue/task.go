// Package queue is the path between the outbox and the ledger on asynq:
// the enqueuer that moves committed events into the queue, the worker
// that applies them, stale recovery, and the scheduler's periodic jobs.
// asynq is at-least-once and its TaskID dedups only while a task exists;
// the database, not the queue, decides what happened to an event.
package queue

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Queues, by weight: maintenance never starves payments.
const (
	QueuePayments      = "payments"
	QueueNotifications = "notifications"
	QueueMaintenance   = "maintenance"
)

// QueueWeights are asynq's weighted priorities for the worker.
var QueueWeights = map[string]int{QueuePayments: 6, QueueNotifications: 3, QueueMaintenance: 1}

// Task types.
const (
	TypePayment     = "payment:apply"
	TypeWatchReorgs = "maintenance:watch_reorgs"
	TypeNotify      = "notifications:deliver"
)

// Retry policy of the seed: at most five retries, full-jitter exponential
// backoff from one second, capped at a minute.
const (
	RetryMax       = 5
	RetryBaseDelay = time.Second
	RetryMaxDelay  = 60 * time.Second
	// TaskTimeout bounds one run of a payment task (chain check, batch
	// wait, transaction); a task past it is retried.
	TaskTimeout = 60 * time.Second
)

// RetryDelay is the production backoff: uniform(0, min(60s, 1s·2^n)).
var RetryDelay = FullJitter(RetryBaseDelay, RetryMaxDelay)

// outageBackoffSteps fixes the retry delay while a dependency is down:
// IsFailure keeps such retries off the budget, so the attempt count does
// not grow and cannot space them out.
const outageBackoffSteps = 3

// IsFailure tells asynq which errors spend a task's retry budget. A
// dependency outage (PostgreSQL unreachable, restarting, failing over) is
// not the event's fault: its task retries for as long as the outage lasts
// and stays within budget, instead of dead-lettering every event in flight
// during a failover.
func IsFailure(err error) bool { return !errors.Is(err, payment.ErrUnavailable) }

// FullJitter returns asynq's retry delay function for
// uniform(0, min(ceiling, base·2^attempt)); during an outage (which does
// not count as an attempt) uniform(base, min(ceiling, base·2^3)).
func FullJitter(base, ceiling time.Duration) asynq.RetryDelayFunc {
	return func(attempt int, err error, _ *asynq.Task) time.Duration {
		if err != nil && !IsFailure(err) {
			limit := min(ceiling, base<<outageBackoffSteps)
			return base + time.Duration(rand.Int64N(int64(max(limit-base, 0))+1)) //nolint:gosec // G404: retry jitter, not a secret
		}
		limit := ceiling
		if attempt >= 0 && attempt < 32 && base<<attempt > 0 && base<<attempt < ceiling {
			limit = base << attempt
		}
		return time.Duration(rand.Int64N(int64(limit) + 1)) //nolint:gosec // G404: retry jitter, not a secret
	}
}

// PaymentTask is the payload of a payment task. The amount travels as a
// decimal string; the ledger takes every value from the stored row and
// only checks that the task describes it.
type PaymentTask struct {
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	UserID     int64     `json:"user_id"`
	Asset      string    `json:"asset"`
	Amount     string    `json:"amount"`
	TxHash     string    `json:"tx_hash,omitempty"`
	Generation int       `json:"generation"`
	TraceID    string    `json:"trace_id"`
	AcceptedAt time.Time `json:"accepted_at"`
	// TraceParent is this event's own W3C traceparent (events of one task
	// come from different traces): the worker's span continues it.
	TraceParent string `json:"traceparent,omitempty"`
}

// PaymentBatch is the payload of a payment task: the events of one
// chunk of a claim. A payload that is a single PaymentTask object (tasks
// enqueued before batches existed) is read as a batch of one.
type PaymentBatch struct {
	Events []PaymentTask `json:"events"`
}

// NewPaymentTask builds the task of one claimed event, alone.
func NewPaymentTask(c postgres.Claimed) (*asynq.Task, []asynq.Option, error) {
	c.TaskID = ""
	return NewPaymentBatch([]postgres.Claimed{c})
}

// NewPaymentBatch builds the task that carries the claimed events, which
// share a task id (or are one event without one).
func NewPaymentBatch(events []postgres.Claimed) (*asynq.Task, []asynq.Option, error) {
	if len(events) == 0 {
		return nil, nil, errors.New("payment task with no events")
	}
	id := events[0].TaskID
	if id == "" {
		if len(events) > 1 {
			return nil, nil, fmt.Errorf("%d events without a task id", len(events))
		}
		id = TaskID(events[0].Event)
	}
	batch := PaymentBatch{Events: make([]PaymentTask, len(events))}
	for i, c := range events {
		if c.TaskID != events[0].TaskID {
			return nil, nil, fmt.Errorf("events of tasks %q and %q in one task", events[0].TaskID, c.TaskID)
		}
		e := c.Event
		batch.Events[i] = PaymentTask{
			EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
			TxHash: e.TxHash, Generation: e.Generation, TraceID: e.TraceID, AcceptedAt: c.CreatedAt, TraceParent: c.TraceParent,
		}
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return nil, nil, err
	}
	opts := []asynq.Option{
		asynq.TaskID(id),
		asynq.Queue(QueuePayments),
		asynq.MaxRetry(RetryMax),
		asynq.Timeout(TaskTimeout),
	}
	return asynq.NewTask(TypePayment, body), opts, nil
}

// TaskID derives the queue-level id from the idempotency key and the
// generation: a recovered event gets a new id, so its re-enqueue can never
// collide with a zombie task of the old generation still in Redis.
func TaskID(e payment.Event) string {
	return e.Key() + "-g" + strconv.Itoa(e.Generation)
}

// Event converts the payload to the domain event it describes.
func (p PaymentTask) Event() (payment.Event, error) {
	amount, err := decimal.NewFromString(p.Amount)
	if err != nil {
		return payment.Event{}, fmt.Errorf("amount %q: %w", p.Amount, err)
	}
	return payment.Event{
		ID: p.EventID, Type: payment.EventType(p.EventType), UserID: p.UserID, Asset: p.Asset, Amount: amount,
		TxHash: p.TxHash, Generation: p.Generation, TraceID: p.TraceID,
	}, nil
}

// DecodePaymentTask reads a payload: a batch, or one event alone. A
// malformed payload, or any malformed event in it, can never succeed; the
// well-formed events of a task dead-lettered so stay 'enqueued', and stale
// recovery hands them out again.
func DecodePaymentTask(body []byte) ([]PaymentTask, []payment.Event, error) {
	var batch PaymentBatch
	if err := json.Unmarshal(body, &batch); err != nil {
		return nil, nil, payment.Invalid("payment task payload: %v", err)
	}
	if batch.Events == nil {
		var one PaymentTask
		if err := json.Unmarshal(body, &one); err != nil {
			return nil, nil, payment.Invalid("payment task payload: %v", err)
		}
		batch.Events = []PaymentTask{one}
	}
	if len(batch.Events) == 0 || len(batch.Events) > postgres.TaskEventsMax {
		return batch.Events, nil, payment.Invalid("payment task carries %d events, not 1..%d", len(batch.Events), postgres.TaskEventsMax)
	}
	events := make([]payment.Event, len(batch.Events))
	for i, p := range batch.Events {
		if p.EventID == "" {
			return batch.Events, nil, payment.Invalid("payment task payload: event %d has no event_id", i)
		}
		e, err := p.Event()
		if err != nil {
			return batch.Events, nil, payment.Invalid("payment task payload: event %s: %v", p.EventID, err)
		}
		events[i] = e
	}
	return batch.Events, events, nil
}

// pendingListKey is where asynq keeps a queue's waiting tasks; the
// enqueuer reads its length for backpressure. It is asynq's internal
// layout (v0.26), checked by a test against a real asynq.
func pendingListKey(queue string) string { return "asynq:{" + queue + "}:pending" }
