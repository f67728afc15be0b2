// Package task is what both sides of asynq agree on: queue names, task
// types, the payment task's payload and options, and the Redis names the
// enqueuer and the worker both read (the pending list, the wake-up
// channel). asynq is at-least-once and its TaskID dedups only while a task
// exists; the database, not the queue, decides what happened to an event.
package task

import (
	"encoding/json"
	"errors"
	"fmt"
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

// Task types.
const (
	TypePayment     = "payment:apply"
	TypeWatchReorgs = "maintenance:watch_reorgs"
	TypeNotify      = "notifications:deliver"
	// TypeRecheck is an operator's recheck handed by an api without an
	// RPC of its own to the workers, which have one.
	TypeRecheck = "maintenance:recheck"
)

// RecheckTask is the payload of a recheck task: what the api's admin
// route was asked, answered through the recheck's record.
type RecheckTask struct {
	EventID     string `json:"event_id"`
	RequestedBy string `json:"requested_by"`
}

// RecheckTimeout bounds a recheck task's run (a few RPC calls and two
// short transactions).
const RecheckTimeout = 30 * time.Second

// NewRecheckTask builds the task of one recheck; id names it (each
// request is its own task), and it is neither retried nor kept: the
// operator asks again.
func NewRecheckTask(id string, r RecheckTask) (*asynq.Task, []asynq.Option, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	return asynq.NewTask(TypeRecheck, payload), []asynq.Option{
		asynq.Queue(QueueMaintenance), asynq.TaskID(TypeRecheck + ":" + id),
		asynq.MaxRetry(0), asynq.Timeout(RecheckTimeout), asynq.Retention(0),
	}, nil
}

// RetryMax is the seed's retry budget of a payment task (asynq's
// MaxRetry); the worker's backoff is worker.FullJitter.
const RetryMax = 5

// TaskTimeout bounds one run of a payment task (chain check, batch wait,
// transaction); a task past it is retried.
const TaskTimeout = 60 * time.Second

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

// PendingListKey is where asynq keeps a queue's waiting tasks: the
// enqueuer reads its length for backpressure, the worker's waker
// recognises dequeues of it. It is asynq's internal layout (v0.26),
// checked by a test against a real asynq.
func PendingListKey(queue string) string { return "asynq:{" + queue + "}:pending" }

// WakeList is the Redis list on which enqueuers leave wake-ups for idle
// workers: one element per payments task enqueued ("1"), "" for an
// unsaid number, or a queue's name (WakeQueuePrefix). A worker waiting
// on an empty queue pops one with BLPOP in the same round trip as its
// next dequeue, so Redis runs the dequeue the moment a wake-up lands,
// and only one waiting worker wakes for it.
const WakeList = "settle:wakeups"

// WakeListMax bounds WakeList: wake-ups left while every worker is busy
// are trimmed to the newest this many (each costs a worker at most one
// look; a task whose wake-up was trimmed is found within a wait).
const WakeListMax = 1024

// WakeQueuePrefix starts a wake-up that names a queue other than
// payments ("queue:notifications"): a task was enqueued there.
const WakeQueuePrefix = "queue:"
