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
			return base + time.Duration(rand.Int64N(int64(max(limit-base, 0))+1))
		}
		limit := ceiling
		if attempt >= 0 && attempt < 32 && base<<attempt > 0 && base<<attempt < ceiling {
			limit = base << attempt
		}
		return time.Duration(rand.Int64N(int64(limit) + 1))
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
}

// NewPaymentTask builds the task for a claimed event.
func NewPaymentTask(c postgres.Claimed) (*asynq.Task, []asynq.Option, error) {
	e := c.Event
	body, err := json.Marshal(PaymentTask{
		EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
		TxHash: e.TxHash, Generation: e.Generation, TraceID: e.TraceID, AcceptedAt: c.CreatedAt,
	})
	if err != nil {
		return nil, nil, err
	}
	opts := []asynq.Option{
		asynq.TaskID(TaskID(e)),
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

// DecodePaymentTask reads a payload; malformed payloads can never succeed.
func DecodePaymentTask(body []byte) (PaymentTask, payment.Event, error) {
	var p PaymentTask
	if err := json.Unmarshal(body, &p); err != nil {
		return p, payment.Event{}, payment.Invalid("payment task payload: %v", err)
	}
	if p.EventID == "" {
		return p, payment.Event{}, payment.Invalid("payment task payload has no event_id")
	}
	e, err := p.Event()
	if err != nil {
		return p, payment.Event{}, payment.Invalid("payment task payload: %v", err)
	}
	return p, e, nil
}

// pendingListKey is where asynq keeps a queue's waiting tasks; the
// enqueuer reads its length for backpressure. It is asynq's internal
// layout (v0.26), checked by a test against a real asynq.
func pendingListKey(queue string) string { return "asynq:{" + queue + "}:pending" }
