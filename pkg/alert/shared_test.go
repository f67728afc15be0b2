package alert_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestReplicasShareTheCooldown: the scheduler's checks run on whichever
// replica wins each period, so a lasting condition (zombie events, say)
// is raised by every replica in turn. Each replica's own cooldown let
// each of them page once per cooldown: three replicas, three pages for
// one condition every five minutes. With the cooldown shared in Redis the
// first replica's alert goes out and the others' are suppressed; with
// Redis unreachable each replica sends its own rather than none.
func TestReplicasShareTheCooldown(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { posts.Add(1) }))
	defer srv.Close()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	replicas := make([]*alert.Alerter, 3)
	for i := range replicas {
		replicas[i] = alert.New(zerolog.New(io.Discard), alert.Options{Service: "scheduler", WebhookURL: srv.URL, Shared: rdb})
		defer replicas[i].Close()
	}
	for _, a := range replicas {
		a.Raise("zombie_enqueued", alert.Critical, "events enqueued for over 15 minutes", map[string]any{"count": 3})
		time.Sleep(200 * time.Millisecond) // one period each, in turn
	}
	require.Eventually(t, func() bool { return posts.Load() >= 1 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.EqualValues(t, 1, posts.Load(), "one condition paged once per cooldown, not once per replica")

	// Another key is its own.
	replicas[1].Raise("dlq_flood", alert.Critical, "more than 10 dead letters in the last hour", nil)
	require.Eventually(t, func() bool { return posts.Load() == 2 }, 5*time.Second, 10*time.Millisecond)

	// Redis down: every replica sends (an alert is never lost to Redis).
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer down.Close()
	for range 2 {
		a := alert.New(zerolog.New(io.Discard), alert.Options{Service: "scheduler", WebhookURL: srv.URL, Shared: down})
		defer a.Close()
		a.Raise("reconcile_mismatch:hot_path", alert.Critical, "mismatch", nil)
	}
	require.Eventually(t, func() bool { return posts.Load() == 4 }, 10*time.Second, 10*time.Millisecond)
}
