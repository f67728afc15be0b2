package scale

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// TestManyReplicas runs 2 api, 3 worker and 2 scheduler processes on one
// database and one Redis. The load reaches the apis through the front,
// which alternates first deliveries between them and sends every
// redelivery of an event (a later duplicate, a concurrent duplicate, a
// conflicting one) to the other api than the delivery before it. Nothing
// may be doubled or lost, and the two schedulers, with periods short
// enough that each job runs many times, never run a job twice in one
// period.
func TestManyReplicas(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["RECOVER_INTERVAL"] = "300ms"
	s.Env["DLQ_DRAIN_INTERVAL"] = "300ms"
	s.Env["REORG_WATCH_INTERVAL"] = "300ms"
	s.Env["NOTIFY_INTERVAL"] = "300ms"
	apis := []*harness.Proc{s.StartAPI(nil), s.StartAPI(nil)}
	for range 3 {
		s.StartWorker(nil)
	}
	schedulers := []*harness.Proc{s.StartScheduler(nil), s.StartScheduler(nil)}
	db := testenv.OpenDB(t, s.DatabaseURL)

	f := newFront(t, apis[0].URL(), apis[1].URL())
	const events = 3000
	runLoad(t, s, db, f, load{events: events, users: 100, withdrawals: 30, concurrency: 48, runID: "replicas"})
	requireBooks(t, db, s)

	first, second, crossed := f.delivered[0].Load(), f.delivered[1].Load(), f.crossed.Load()
	t.Logf("webhooks: %d to %s, %d to %s; %d redeliveries sent to the other api than the delivery before",
		first, apis[0].Name, second, apis[1].Name, crossed)
	require.Greater(t, first, int64(events/3), "load spread over both apis")
	require.Greater(t, second, int64(events/3), "load spread over both apis")
	require.Positive(t, crossed, "duplicates crossed between the apis")
	deadlocks := 0
	for _, p := range apis {
		deadlocks += strings.Count(p.Logs(), "deadlock detected")
	}
	// Each is a webhook answered 503 and redelivered: the batched insert
	// takes row locks in arrival order, so two apis' batches holding the
	// same events in different orders can deadlock.
	t.Logf("webhooks answered 503 after their batch lost a deadlock in insert_events: %d", deadlocks)

	// Stopped, the schedulers have written every "job ran" line.
	for _, p := range schedulers {
		require.Equal(t, 0, p.Stop(15*time.Second), "%s stops cleanly", p.Name)
	}
	runs := jobRuns(t, schedulers...)
	perScheduler := make([]int, len(schedulers))
	for i, p := range schedulers {
		perScheduler[i] = jobRuns(t, p)
	}
	t.Logf("job runs: %d, by scheduler %v, no (job, period) twice", runs, perScheduler)
	require.Greater(t, runs, 20, "the jobs kept running")
}
