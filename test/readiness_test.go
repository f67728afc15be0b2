package test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/test/harness"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestAPIReadyWithoutRedis: readiness is PostgreSQL, Redis and the
// schema, as the contract says: stopping Redis makes every process not
// ready, the api included, though it still takes webhooks (the outbox is
// PostgreSQL's); an api with READY_WITHOUT_REDIS stays ready. /healthz
// and settle_redis_up say Redis is down, and once it is back everyone is
// ready and the deposit settles.
func TestAPIReadyWithoutRedis(t *testing.T) {
	ctx := context.Background()
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(rds.Close)
	s := harness.NewStack(t)
	s.Env["REDIS_URL"] = rds.URL(0)
	api := s.StartAPI(nil)
	lenient := s.StartAPI(map[string]string{"READY_WITHOUT_REDIS": "true"})
	worker := s.StartWorker(nil)
	// An event claimed while Redis is down waits for stale recovery.
	scheduler := s.StartScheduler(map[string]string{"STALE_ENQUEUED_AFTER": "3s", "RECOVER_INTERVAL": "1s"})
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)

	status, body := get(t, api.URL()+"/healthz")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"redis":"ok"`)

	rds.Stop()
	s.WaitFor("worker and scheduler not ready", 30*time.Second, func() bool {
		w, _ := get(t, worker.URL()+"/readyz")
		sc, _ := get(t, scheduler.URL()+"/readyz")
		return w == http.StatusServiceUnavailable && sc == http.StatusServiceUnavailable
	})
	s.WaitFor("the api not ready", 10*time.Second, func() bool {
		status, body := get(t, api.URL()+"/readyz")
		return status == http.StatusServiceUnavailable && strings.Contains(body, `"redis":"unreachable"`)
	})
	status, body = get(t, lenient.URL()+"/readyz")
	require.Equal(t, http.StatusOK, status, "READY_WITHOUT_REDIS: PostgreSQL and the schema only: %s", body)
	require.NotContains(t, body, "redis")
	s.WaitFor("healthz to see Redis down", 10*time.Second, func() bool {
		status, body := get(t, api.URL()+"/healthz")
		return status == http.StatusOK && strings.Contains(body, `"redis":"unreachable"`)
	})
	_, metrics := get(t, api.URL()+"/metrics")
	require.Contains(t, metrics, "settle_redis_up 0")
	_, workerReady := get(t, worker.URL()+"/readyz")
	require.Contains(t, workerReady, "redis")

	// Ingest goes on: the deposit is durable in PostgreSQL's outbox.
	code, resp, err := client.Webhook(harness.Payment("no-redis-1", "deposit", 1, "ETH", "3"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, resp)
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'no-redis-1'`))

	// Redis back: everyone ready, and the deposit settles.
	require.NoError(t, rds.Start(ctx))
	api.WaitReady(30 * time.Second)
	worker.WaitReady(30 * time.Second)
	scheduler.WaitReady(30 * time.Second)
	s.WaitFor("the deposit confirmed", 60*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'no-redis-1' AND status = 'confirmed'`) == 1
	})
	s.WaitFor("settle_redis_up 1", 10*time.Second, func() bool {
		_, metrics := get(t, api.URL()+"/metrics")
		return strings.Contains(metrics, "settle_redis_up 1")
	})
}
