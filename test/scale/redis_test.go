package scale

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

const (
	// failoverTimeout bounds how long the sentinels may take to promote
	// the replica after the master dies (down-after 1s, then the vote).
	failoverTimeout = time.Minute
	// sharedRateLimit keeps the api's Redis-backed limiters working (our
	// own Redis use, beside asynq) without ever refusing the load; the
	// signed load is counted by WEBHOOK_VERIFIED_RATE_LIMIT.
	sharedRateLimit = "1000000/s,1000000/m"
)

// TestSentinelFailover runs settle on Redis Sentinel (a master, a replica,
// three sentinels, REDIS_URL=redis-sentinel://...) under a steady load,
// kills the master mid-run (SIGKILL: whatever it had not replicated is
// lost) and keeps the load going. The sentinels promote the replica,
// every process's client follows it, and tasks lost with the old master
// come back through the database's stale recovery. Every accepted event
// must end as if nothing happened: terminal, once, books balanced.
func TestSentinelFailover(t *testing.T) {
	if _, err := devenv.RedisSentinelPath(); err != nil {
		t.Fatalf("%v: the scale tests fail Redis over with real sentinels", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := harness.NewStack(t)
	ha, err := devenv.StartSentinel(ctx, devenv.SentinelOptions{DownAfter: time.Second, FailoverTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		stopAll(s) // the processes stop before their Redis goes away
		if t.Failed() {
			t.Logf("%s", ha.SentinelLogs(20))
		}
		ha.Close()
	})
	s.Env["REDIS_URL"] = ha.URL(0)
	s.Env["WEBHOOK_RATE_LIMIT"] = sharedRateLimit
	s.Env["WEBHOOK_VERIFIED_RATE_LIMIT"] = sharedRateLimit // signed load counts only here
	// Short enough that lost tasks come back within the test, and enough
	// recoveries that slowness alone never dead-letters an event.
	s.Env["STALE_ENQUEUED_AFTER"] = "5s"
	s.Env["RECOVER_INTERVAL"] = "1s"
	s.Env["MAX_RECOVERY_ATTEMPTS"] = "1000"
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	db := testenv.OpenDB(t, s.DatabaseURL)

	// About fifteen seconds of steady traffic, the failover in its middle.
	l := load{events: 1500, rate: 100, users: 60, withdrawals: 30, runID: "sentinel"}
	type outcome struct {
		res loadgen.Result
		err error
	}
	done := make(chan outcome, 1)
	f := newFront(t, api.URL())
	go func() {
		res, err := sendLoad(db, f.URL, l)
		done <- outcome{res, err}
	}()
	s.WaitFor("a quarter of the load settled before the failover", 2*time.Minute, func() bool {
		return s.Count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`) >= l.events/4
	})
	oldMaster := ha.Nodes[0]
	oldMaster.Kill()
	killedAt := time.Now()
	newMaster, err := ha.WaitForMaster(ctx, oldMaster, failoverTimeout)
	require.NoError(t, err)
	t.Logf("failover: %s promoted %.1fs after %s was killed", newMaster.Addr(), time.Since(killedAt).Seconds(), oldMaster.Addr())
	var failedOverAt time.Time
	require.NoError(t, s.DB.QueryRow(ctx, `SELECT now()`).Scan(&failedOverAt))

	got := <-done
	checkLoad(t, s, f, l, got.res, got.err)
	requireBooks(t, db, s)
	require.Positive(t, s.Count(`SELECT count(*) FROM payment_events WHERE created_at > $1`, failedOverAt),
		"the load kept going after the failover")
	t.Logf("events recovered from the database after their task was lost or stuck: %d",
		s.Count(`SELECT count(*) FROM payment_events WHERE generation > 0`))

	// The new master holds asynq's queues and the api's shared rate
	// limits: both kinds of Redis use followed the failover.
	rdb := redis.NewClient(&redis.Options{Addr: newMaster.Addr()})
	defer rdb.Close()
	require.Positive(t, countKeys(ctx, t, rdb, "asynq:*"), "asynq writes to the new master")
	require.Positive(t, countKeys(ctx, t, rdb, "settle:ratelimit:*"), "the rate limiter writes to the new master")
}

// TestRedisTLSEndToEnd runs the whole system on a TLS-only Redis whose
// certificate comes from a private CA, trusted through REDIS_URL's
// tls_ca_file: asynq and settle's own Redis use (the shared rate limiter)
// both go over TLS.
func TestRedisTLSEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := harness.NewStack(t)
	server, err := devenv.StartRedisTLS(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		stopAll(s)
		server.Close()
	})
	s.Env["REDIS_URL"] = server.URL(0)
	require.True(t, strings.HasPrefix(s.Env["REDIS_URL"], "rediss://"))
	s.Env["WEBHOOK_RATE_LIMIT"] = sharedRateLimit
	s.Env["WEBHOOK_VERIFIED_RATE_LIMIT"] = sharedRateLimit // signed load counts only here
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	db := testenv.OpenDB(t, s.DatabaseURL)

	runLoad(t, s, db, newFront(t, api.URL()), load{events: 500, users: 30, withdrawals: 30, runID: "tls"})
	requireBooks(t, db, s)

	rdb, err := redisconn.Open(server.URL(0))
	require.NoError(t, err)
	defer rdb.Close()
	require.Positive(t, countKeys(ctx, t, rdb, "asynq:*"), "asynq's queues live on the TLS server")
	require.Positive(t, countKeys(ctx, t, rdb, "settle:ratelimit:*"), "the rate limiter's counters live on the TLS server")
}

// countKeys counts keys matching pattern with SCAN (bounded rounds).
func countKeys(ctx context.Context, t *testing.T, rdb redis.UniversalClient, pattern string) int {
	t.Helper()
	const roundsMax = 10_000
	var cursor uint64
	n := 0
	for range roundsMax {
		keys, next, err := rdb.Scan(ctx, cursor, pattern, 1000).Result()
		require.NoError(t, err)
		n += len(keys)
		if cursor = next; cursor == 0 {
			return n
		}
	}
	t.Fatalf("SCAN %s did not finish in %d rounds", pattern, roundsMax)
	return n
}
