package worker

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/task"
)

// QueueWeights are asynq's weighted priorities for the worker:
// maintenance never starves payments.
var QueueWeights = map[string]int{task.QueuePayments: 6, task.QueueNotifications: 3, task.QueueMaintenance: 1}

// Retry policy of the seed: at most task.RetryMax retries, full-jitter
// exponential backoff from one second, capped at a minute.
const (
	RetryBaseDelay = time.Second
	RetryMaxDelay  = 60 * time.Second
	// RetryMaxDelayMax bounds RETRY_MAX_DELAY.
	RetryMaxDelayMax = 24 * time.Hour
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
