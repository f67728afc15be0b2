package main

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestMaintenanceTaskWakesTheWorkers: the job enqueues one task per
// period and leaves the wake-up that names its queue, once: a second
// run in the same period (another scheduler's) enqueues and wakes
// nothing.
func TestMaintenanceTaskWakesTheWorkers(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	require.NoError(t, rdb.Del(ctx, task.WakeList).Err())

	client := asynq.NewClientFromRedisClient(rdb)
	job := enqueueMaintenance(client, rdb, task.QueueNotifications, task.TypeNotify, time.Hour)
	require.NoError(t, job(ctx))
	require.NoError(t, job(ctx))

	wakes, err := rdb.LRange(ctx, task.WakeList, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{task.WakeQueuePrefix + task.QueueNotifications}, wakes,
		"one wake-up naming the queue, none for the second run's task that was not enqueued")
	n, err := rdb.LLen(ctx, task.PendingListKey(task.QueueNotifications)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}
