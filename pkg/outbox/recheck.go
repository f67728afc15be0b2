package outbox

import (
	"context"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/task"
)

// RecheckQueue hands operators' rechecks to the workers, for an api that
// cannot ask the chain itself: a task on the maintenance queue, then a
// wake-up for idle workers (a lost one costs the task a few seconds of
// their poll, never the task).
type RecheckQueue struct {
	client *asynq.Client
	redis  redis.UniversalClient
}

// NewRecheckQueue builds the queue on a shared Redis client.
func NewRecheckQueue(rdb redis.UniversalClient) *RecheckQueue {
	return &RecheckQueue{client: asynq.NewClientFromRedisClient(rdb), redis: rdb}
}

// Enqueue hands one recheck over; id names the request.
func (q *RecheckQueue) Enqueue(ctx context.Context, id string, r task.RecheckTask) error {
	t, opts, err := task.NewRecheckTask(id, r)
	if err != nil {
		return err
	}
	if _, err := q.client.EnqueueContext(ctx, t, opts...); err != nil {
		return err
	}
	_ = PublishQueueWake(ctx, q.redis, task.QueueMaintenance)
	return nil
}
