package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

// Bounds of contention retries (RETRY_CONTENTION_WINDOW).
const (
	// ContentionWindowDefault is how long, from a task's first contention
	// failure, its contention failures retry without spending its budget.
	ContentionWindowDefault = 5 * time.Minute
	// ContentionWindowMax bounds RETRY_CONTENTION_WINDOW: a poison event
	// retries this long (and then spends its budget) before the DLQ.
	ContentionWindowMax = time.Hour
	// contentionLinger keeps a task's first contention failure this long
	// after its latest one. Its runs come at most RETRY_MAX_DELAY (at most
	// a day) apart, so its window never starts again while it retries.
	contentionLinger = RetryMaxDelayMax + time.Hour
	// contentionRedisTimeout bounds the round trip that reads the window.
	contentionRedisTimeout = 2 * time.Second
)

// ContentionKey is the Redis key holding the time (Redis's clock, unix
// milliseconds) of a task's first contention failure.
func ContentionKey(taskID string) string { return "settle:contention:" + taskID }

// contentionScript records a task's first contention failure and returns
// the milliseconds since it (0 on the first). Redis's clock, so workers
// with skewed clocks agree. KEYS[1] the task's key; ARGV[1] its TTL (ms).
var contentionScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = redis.call('GET', KEYS[1])
if not first then
  first = string.format('%d', now)
end
redis.call('SET', KEYS[1], first, 'PX', ARGV[1])
return now - tonumber(first)
`)

// forgiveContention turns the contention failures of a task's events
// (lock or statement timeout, deadlock, serialisation failure) into
// retries that spend no budget while the task is within the window from
// its first one. A lock held by a migration or an operator's DDL fails
// every event alike, and no event is at fault; an event whose own
// statement always times out still reaches the DLQ, after the window and
// then its budget. Without Redis, or when Redis does not answer, the
// failures spend the budget as before.
func (w *Worker) forgiveContention(ctx context.Context, runs []eventRun) {
	if w.contention == nil || w.contentionWindow <= 0 {
		return
	}
	var contended []*eventRun
	for i := range runs {
		r := &runs[i]
		if r.err != nil && !r.failed && postgres.Contention(r.err) && !errors.Is(r.err, payment.ErrUnavailable) {
			contended = append(contended, r)
		}
	}
	if len(contended) == 0 {
		return
	}
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return
	}
	// Not the task's context: a run cut by its deadline must still count.
	redisCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), contentionRedisTimeout)
	defer cancel()
	ms, err := contentionScript.Run(redisCtx, w.contention, []string{ContentionKey(id)},
		(w.contentionWindow + contentionLinger).Milliseconds()).Int64()
	if err != nil {
		w.log.Warn().Err(err).Str("task_id", id).Msg("contention window unreadable; the task's lock timeouts spend its retries")
		return
	}
	since := time.Duration(ms) * time.Millisecond
	if since >= w.contentionWindow {
		w.log.Warn().Str("task_id", id).Dur("since_first", since).Dur("window", w.contentionWindow).
			Msg("contention outlasted RETRY_CONTENTION_WINDOW; the task's lock timeouts spend its retries")
		return
	}
	for _, r := range contended {
		w.metrics.tasks.WithLabelValues(task.TypePayment, "contention").Inc()
		r.err = payment.Unavailable(fmt.Sprintf("contention for %s of RETRY_CONTENTION_WINDOW %s", since.Round(time.Millisecond), w.contentionWindow), r.err)
	}
}
