// Package test holds settle's end-to-end tests: real api, worker and
// scheduler processes against throwaway PostgreSQL and Redis.
package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func requireInvariants(t *testing.T, s *harness.Stack) {
	t.Helper()
	db := testenv.OpenDB(t, s.DatabaseURL)
	report, err := invariant.Check(context.Background(), db, invariant.Quiet())
	require.NoError(t, err)
	require.True(t, report.OK(), report.String())
}

func createUsers(t *testing.T, c *harness.Client, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		status, body, err := c.Admin(http.MethodPut, fmt.Sprintf("/admin/users/%d", id), nil)
		require.NoError(t, err)
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, status, body)
	}
}

// TestDepositsWithDuplicateDeliveries: api, two workers and the scheduler;
// 1,000 signed deposits with 20% duplicate deliveries (some concurrent
// with their original) → all confirmed, each credited once.
func TestDepositsWithDuplicateDeliveries(t *testing.T) {
	s := harness.NewStack(t)
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartWorker(nil)
	scheduler := s.StartScheduler(nil)
	client := harness.NewClient(api.URL())
	users := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	createUsers(t, client, users...)

	const n = 1000
	amounts := []string{"1.5", "0.25", "2", "0.1", "3.000000000000000001"}
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = harness.Payment(fmt.Sprintf("e2e-%d", i), "deposit", users[i%len(users)], "ETH", amounts[i%len(amounts)])
	}
	var deliveries [][]byte
	deliveries = append(deliveries, bodies...)
	for i := 0; i < n; i += 5 { // 20% delivered twice
		deliveries = append(deliveries, bodies[i])
	}
	rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	var accepted, duplicate atomic.Int64
	work := make(chan []byte)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range work {
				status, resp, err := client.Webhook(body)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, status, resp)
				switch resp["status"] {
				case "accepted":
					accepted.Add(1)
				case "duplicate":
					duplicate.Add(1)
				default:
					t.Errorf("unexpected answer %v", resp)
				}
			}
		}()
	}
	for _, body := range deliveries {
		work <- body
	}
	close(work)
	wg.Wait()
	require.EqualValues(t, n, accepted.Load())
	require.EqualValues(t, n/5, duplicate.Load())

	s.WaitFor("every deposit confirmed", 2*time.Minute, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE status='confirmed'`) == n
	})
	require.Equal(t, n, s.Count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, n, s.Count(`SELECT count(*) FROM processed_events WHERE outcome='success'`))
	require.NotContains(t, scheduler.Logs(), "LISTEN receives no notifications", "a direct connection passes the listener's self-check")
	requireInvariants(t, s)
}

// TestWorkerKilledWhileHoldingTasks SIGKILLs a worker whose tasks are
// stuck waiting on a row lock, then restarts it: every event completes
// once, through asynq's lease or stale recovery, whichever comes first.
func TestWorkerKilledWhileHoldingTasks(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["STALE_ENQUEUED_AFTER"] = "5s"
	s.Env["RECOVER_INTERVAL"] = "1s"
	s.Env["LEDGER_LOCK_TIMEOUT"] = "20s"
	s.Env["LEDGER_STATEMENT_TIMEOUT"] = "25s"
	api := s.StartAPI(nil)
	worker := s.StartWorker(nil)
	s.StartScheduler(nil)
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)

	// Hold user 1's balance row so the worker's transaction waits on it.
	ctx := context.Background()
	warm, _, err := client.Webhook(harness.Payment("warm", "deposit", 1, "USDC", "1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, warm)
	s.WaitFor("warm-up confirmed", 30*time.Second, s.AllTerminal)
	tx, err := s.DB.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id = 1 AND asset = 'USDC' FOR UPDATE`)
	require.NoError(t, err)

	for i := range 20 {
		status, _, err := client.Webhook(harness.Payment(fmt.Sprintf("held-%d", i), "deposit", 1, "USDC", "1"))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
	}
	s.WaitFor("the worker holds tasks", 30*time.Second, func() bool {
		var waiting int
		_ = s.DB.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'settle-worker'`).Scan(&waiting)
		return waiting > 0
	})
	worker.Kill()
	require.NoError(t, tx.Rollback(ctx))
	worker.Start()
	worker.WaitReady(30 * time.Second)

	s.WaitFor("every event confirmed", 3*time.Minute, s.AllTerminal)
	require.Equal(t, 21, s.Count(`SELECT count(*) FROM payment_events WHERE status='confirmed'`))
	require.Equal(t, 21, s.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	requireInvariants(t, s)
}

// TestRedisFlushedAfterEnqueue loses every queued task: stale recovery
// re-enqueues them under new task ids and everything completes.
func TestRedisFlushedAfterEnqueue(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["STALE_ENQUEUED_AFTER"] = "2s"
	s.Env["RECOVER_INTERVAL"] = "1s"
	api := s.StartAPI(nil)
	scheduler := s.StartScheduler(nil)
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1, 2)
	for i := range 50 {
		status, _, err := client.Webhook(harness.Payment(fmt.Sprintf("flush-%d", i), "deposit", int64(i%2+1), "DAI", "0.5"))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
	}
	// Events travel several to a task: every event enqueued, and every
	// task the rows name waiting in the queue.
	s.WaitFor("all 50 events in the queue", 30*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued'`) == 50 &&
			queuedTasks(t, s.RedisURL) == s.Count(`SELECT count(DISTINCT COALESCE(task_id, event_id)) FROM payment_events`)
	})
	flushRedis(t, s.RedisURL)
	s.StartWorker(nil)
	s.WaitFor("every event confirmed", 2*time.Minute, s.AllTerminal)
	require.Equal(t, 50, s.Count(`SELECT count(*) FROM payment_events WHERE status='confirmed' AND generation = 1`), "each went through recovery once")
	require.Contains(t, scheduler.Logs(), "stale event back to the outbox")
	requireInvariants(t, s)
}

// TestRedisDownLongerThanRecoveries: with the queue unreachable for more
// than MAX_RECOVERY_ATTEMPTS recoveries, stuck events end failed with a
// DLQ row and an alert reaches ALERT_WEBHOOK_URL.
func TestRedisDownLongerThanRecoveries(t *testing.T) {
	alerts := newAlertSink(t)
	s := harness.NewStack(t)
	s.Env["STALE_ENQUEUED_AFTER"] = "1s"
	s.Env["RECOVER_INTERVAL"] = "1s"
	s.Env["MAX_RECOVERY_ATTEMPTS"] = "2"
	s.Env["POLL_INTERVAL"] = "200ms"
	s.Env["ALERT_WEBHOOK_URL"] = alerts.URL
	api := s.StartAPI(nil)
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)
	status, _, err := client.Webhook(harness.Payment("stranded", "deposit", 1, "ETH", "1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	// The scheduler's Redis is a port nothing listens on.
	s.Spawn("scheduler", map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"})
	s.WaitFor("dead-lettered", time.Minute, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE event_id='stranded' AND status='failed' AND outcome='dead_lettered'`) == 1
	})
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM dead_letter_queue WHERE event_id='stranded' AND source='recovery'`))
	require.Equal(t, 3, s.Count(`SELECT retry_count FROM payment_events WHERE event_id='stranded'`))
	alerts.waitFor(t, "recovery_dead_letter", 30*time.Second)
	requireInvariants(t, s)
}

// TestTwoSchedulersNeverDoubleFire runs two scheduler processes with short
// job periods and reads their logs: every (job, period) ran exactly once.
func TestTwoSchedulersNeverDoubleFire(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["RECOVER_INTERVAL"] = "300ms"
	s.Env["DLQ_DRAIN_INTERVAL"] = "300ms"
	s.Env["REORG_WATCH_INTERVAL"] = "300ms"
	s.Env["NOTIFY_INTERVAL"] = "300ms"
	a := s.StartScheduler(nil)
	b := s.StartScheduler(nil)
	// Counted from the logs: "job" runs once per (job, period) over both,
	// "local" ones on each replica.
	count := func() (runs int, locals map[string]int, twice []string) {
		locals, seen := map[string]int{}, map[string]string{}
		for _, p := range []*harness.Proc{a, b} {
			for _, line := range strings.Split(p.Logs(), "\n") {
				if !strings.Contains(line, `"message":"job ran"`) {
					continue
				}
				job, period := jsonField(line, "job"), jsonField(line, "period")
				key := job + "@" + period
				if strings.Contains(line, `"local":true`) {
					// Runs on every replica by design (gauge refreshes).
					locals[p.Name]++
					continue
				}
				if other, ok := seen[key]; ok {
					twice = append(twice, fmt.Sprintf("%s ran on %s and %s", key, other, p.Name))
				}
				seen[key] = p.Name
				runs++
			}
		}
		return runs, locals, twice
	}
	// Until enough periods passed, not for a fixed 5 s: a loaded machine
	// runs fewer of them in a given time.
	s.WaitFor("more than 20 job runs and local jobs on both", time.Minute, func() bool {
		runs, locals, _ := count()
		return runs > 20 && locals[a.Name] > 0 && locals[b.Name] > 0
	})
	a.Stop(10 * time.Second)
	b.Stop(10 * time.Second)
	runs, locals, twice := count()
	require.Empty(t, twice, "no (job, period) twice")
	require.Greater(t, runs, 20, "the jobs kept running")
	require.Positive(t, locals[a.Name], "local jobs run on %s too", a.Name)
	require.Positive(t, locals[b.Name], "local jobs run on %s too", b.Name)
}
