package outbox

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/task"
)

// publishTimeout bounds one wake-up; a lost one costs the workers a poll
// (worker.WakeWaitDefault), never a task.
const publishTimeout = time.Second

// PublishWake tells every waiting worker that tasks were enqueued, how
// many unsaid: they look until the queue is empty.
func PublishWake(ctx context.Context, rdb redis.UniversalClient) error {
	return publish(ctx, rdb, "")
}

// PublishWakeFor tells every waiting worker that this many tasks were
// enqueued: a worker that has taken as many looks only once more, after
// the next wake-up or its wait.
func PublishWakeFor(ctx context.Context, rdb redis.UniversalClient, tasks int) error {
	return publish(ctx, rdb, strconv.Itoa(tasks))
}

// PublishQueueWake tells every waiting worker that a task was enqueued on
// queue, one of the queues besides payments (whose wake-ups count tasks).
func PublishQueueWake(ctx context.Context, rdb redis.UniversalClient, queue string) error {
	return publish(ctx, rdb, task.WakeQueuePrefix+queue)
}

func publish(ctx context.Context, rdb redis.UniversalClient, payload string) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return rdb.Publish(ctx, task.WakeChannel, payload).Err()
}
