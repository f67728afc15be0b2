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
// period and publishes the wake-up that names its queue, once: a second
// run in the same period (another scheduler's) enqueues and wakes
// nothing.
func TestMaintenanceTaskWakesTheWorkers(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, task.WakeChannel)
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Receive(ctx) // subscribed
	require.NoError(t, err)

	client := asynq.NewClientFromRedisClient(rdb)
	job := enqueueMaintenance(client, rdb, task.QueueNotifications, task.TypeNotify, time.Hour)
	require.NoError(t, job(ctx))
	require.NoError(t, job(ctx))

	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, task.WakeQueuePrefix+task.QueueNotifications, msg.(*redis.Message).Payload)
	_, err = sub.ReceiveTimeout(ctx, 500*time.Millisecond)
	require.Error(t, err, "a second wake-up for the period's one task")
	n, err := rdb.LLen(ctx, task.PendingListKey(task.QueueNotifications)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}
