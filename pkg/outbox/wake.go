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

// PublishWake tells every waiting worker that tasks were enqueued.
func PublishWake(ctx context.Context, rdb redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return rdb.Publish(ctx, task.WakeChannel, "").Err()
}
