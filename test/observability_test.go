package test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/test/harness"
)

// seriesValue is the value of the first line of a /metrics page that
// matches name{...labels...} (labels as a regexp over the label list).
func seriesValue(t *testing.T, page, name, labels string) (float64, bool) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{` + labels + `\} (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return v, true
}

// TestObservability runs the real binaries: every process exports
// settle_build_info and its GOGC; the scheduler exports the backlog as PostgreSQL holds
// it (per status and network) and asynq's queue series, and both follow
// the events once a worker settles them.
func TestObservability(t *testing.T) {
	s := harness.NewStack(t)
	api := s.StartAPI(nil)
	scheduler := s.StartScheduler(map[string]string{"BACKLOG_INTERVAL": "200ms"})
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)
	for i := range 3 {
		status, body, err := client.Webhook(harness.Payment(fmt.Sprintf("obs-%d", i), "deposit", 1, "ETH", "1"))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, body)
	}

	// No worker yet: the events are enqueued and their task waits in asynq.
	var page string
	s.WaitFor("the backlog gauges to show 3 enqueued events", 30*time.Second, func() bool {
		_, page = get(t, scheduler.URL()+"/metrics")
		v, ok := seriesValue(t, page, "settle_backlog_events", `network="ETH_MAINNET",status="enqueued"`)
		return ok && v == 3
	})
	v, ok := seriesValue(t, page, "settle_backlog_events", `network="ETH_MAINNET",status="pending"`)
	require.True(t, ok, "every status of a seen network is exported")
	require.Zero(t, v)
	_, ok = seriesValue(t, page, "settle_backlog_oldest_pending_seconds", ``)
	require.False(t, ok, "a gauge without labels has no braces")
	require.Regexp(t, `(?m)^settle_backlog_oldest_pending_seconds 0$`, page)
	size, ok := seriesValue(t, page, "asynq_queue_size", `queue="payments"`)
	require.True(t, ok, "asynq's queue collector is registered on the scheduler")
	require.Positive(t, size)

	// The operator's GOGC is kept; the others run with the services' own.
	worker := s.StartWorker(map[string]string{"GOGC": "150"})
	s.WaitFor("the backlog to drain", 30*time.Second, func() bool {
		_, page = get(t, scheduler.URL()+"/metrics")
		v, ok := seriesValue(t, page, "settle_backlog_events", `network="ETH_MAINNET",status="enqueued"`)
		return ok && v == 0 && s.AllTerminal()
	})

	for _, p := range []*harness.Proc{api, worker, scheduler} {
		_, page := get(t, p.URL()+"/metrics")
		v, ok := seriesValue(t, page, "settle_build_info", `revision="[^"]+",version="[^"]+"`)
		require.True(t, ok, "%s exports no settle_build_info", p.Name)
		require.Equal(t, 1.0, v, p.Name)
		gogc := strconv.Itoa(procs.GCPercent)
		if p == worker {
			gogc = "150"
		}
		m := regexp.MustCompile(`(?m)^go_gc_gogc_percent (\S+)$`).FindStringSubmatch(page)
		require.NotNil(t, m, "%s exports no go_gc_gogc_percent", p.Name)
		require.Equal(t, gogc, m[1], "%s's GOGC", p.Name)
	}
}
