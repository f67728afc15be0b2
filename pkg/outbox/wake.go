package outbox

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/task"
)

// publishTimeout bounds one wake-up; a lost one costs the workers a poll
// (worker.WakeWaitDefault), never a task.
const publishTimeout = time.Second

// PublishWake tells a waiting worker that tasks were enqueued, how many
// unsaid: it looks until the queue is empty.
func PublishWake(ctx context.Context, rdb redis.UniversalClient) error {
	return publish(ctx, rdb, "")
}

// PublishWakeFor leaves one wake-up per task enqueued (at most
// task.WakeListMax), so that as many waiting workers each look once.
func PublishWakeFor(ctx context.Context, rdb redis.UniversalClient, tasks int) error {
	if tasks <= 0 {
		return nil
	}
	tokens := make([]any, min(tasks, task.WakeListMax))
	for i := range tokens {
		tokens[i] = "1"
	}
	return publish(ctx, rdb, tokens...)
}

// PublishQueueWake tells a waiting worker that a task was enqueued on
// queue, one of the queues besides payments.
func PublishQueueWake(ctx context.Context, rdb redis.UniversalClient, queue string) error {
	return publish(ctx, rdb, task.WakeQueuePrefix+queue)
}

func publish(ctx context.Context, rdb redis.UniversalClient, tokens ...any) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		pushWake(ctx, p, tokens...)
		return nil
	})
	return err
}

// pushWake queues the wake-ups and the trim that bounds their list.
func pushWake(ctx context.Context, p redis.Pipeliner, tokens ...any) {
	p.RPush(ctx, task.WakeList, tokens...)
	p.LTrim(ctx, task.WakeList, -task.WakeListMax, -1)
}
