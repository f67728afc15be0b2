package periodic_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/periodic"
	"github.com/settle/settle/pkg/testenv"
)

// TestJobGaugesForTheFailingAlert: each job exports its period and run
// bound (the default bound is the period, a minute at least), and the
// time of its last failure, which a success leaves alone: the alert on a
// failing job compares it with the last success.
func TestJobGaugesForTheFailingAlert(t *testing.T) {
	db := testenv.DB(t)
	reg := prometheus.NewRegistry()
	r := &periodic.Runner{Periods: db, Owner: "a", Log: zerolog.Nop()}
	r.RegisterMetrics(reg)
	var runs atomic.Int32
	flaky := periodic.Job{Name: "flaky", Every: 50 * time.Millisecond, Run: func(context.Context) error {
		if runs.Add(1) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}}
	daily := periodic.Job{Name: "nightly", Every: 24 * time.Hour, At: 23*time.Hour + 59*time.Minute, Timeout: time.Hour,
		Run: func(context.Context) error { return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, []periodic.Job{flaky, daily}) }()
	require.Eventually(t, func() bool { return runs.Load() >= 3 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	<-done

	families, err := reg.Gather()
	require.NoError(t, err)
	gauges := map[string]map[string]float64{}
	for _, f := range families {
		gauges[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			gauges[f.GetName()][m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	gauge := func(name, job string) float64 {
		t.Helper()
		v, ok := gauges[name][job]
		require.True(t, ok, "%s{job_name=%q} is not exported", name, job)
		return v
	}
	require.Equal(t, 0.05, gauge("settle_job_interval_seconds", "flaky"))
	require.Equal(t, 60.0, gauge("settle_job_timeout_seconds", "flaky"))
	require.Equal(t, 86400.0, gauge("settle_job_interval_seconds", "nightly"))
	require.Equal(t, 3600.0, gauge("settle_job_timeout_seconds", "nightly"))
	failed, succeeded := gauge("settle_job_last_error_timestamp_seconds", "flaky"), gauge("settle_job_last_success_timestamp_seconds", "flaky")
	require.NotZero(t, failed)
	require.Greater(t, succeeded, failed, "the successes came after the failure")
	require.Len(t, gauges["settle_job_last_error_timestamp_seconds"], 1, "only the job that failed has a failure time")
}
