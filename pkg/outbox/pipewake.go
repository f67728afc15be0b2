package outbox

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/task"
)

// wakeWithEnqueue is the Redis client of the hand-off's asynq client: an
// enqueue of a payments task is pipelined with the workers' wake-up (one
// task announced), so a lone event's task costs the api one Redis round
// trip, not one for the enqueue and another for the wake-up. Redis runs
// them in order, so a worker woken finds the task already pending. An
// enqueue that fails (a task id that exists, a script Redis lost) still
// leaves its wake-up: one without a task costs a worker one empty look.
type wakeWithEnqueue struct {
	redis.UniversalClient
}

// asynq v0.26.0's enqueue script takes the task's key and then the
// queue's pending list (asynq's internal/base.PendingKey).
const enqueueKeys = 2

func (c wakeWithEnqueue) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if !enqueuesPayments(keys) {
		return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
	}
	return c.withWake(ctx, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, sha1, keys, args...) })
}

func (c wakeWithEnqueue) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if !enqueuesPayments(keys) {
		return c.UniversalClient.Eval(ctx, script, keys, args...)
	}
	return c.withWake(ctx, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, script, keys, args...) })
}

func (c wakeWithEnqueue) withWake(ctx context.Context, enqueue func(redis.Pipeliner) *redis.Cmd) *redis.Cmd {
	var cmd *redis.Cmd
	// The enqueue's own answer is in cmd; the pipeline's error is the
	// first of the two, which cmd or the wake-up already says.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = enqueue(p)
		pushWake(ctx, p, "1")
		return nil
	})
	return cmd
}

func enqueuesPayments(keys []string) bool {
	return len(keys) == enqueueKeys && keys[1] == task.PendingListKey(task.QueuePayments)
}
