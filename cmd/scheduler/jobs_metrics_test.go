package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/monitor"
	"github.com/settle/settle/pkg/testenv"
)

// TestJobPeriodsExported: the real scheduler exports every periodic
// job's period and run bound, from its settings, which SettleJobFailing
// sizes a job's lateness by (a day and an hour for the cleanup, minutes
// for the others). A job missing here is never alerted on.
func TestJobPeriodsExported(t *testing.T) {
	metricsPort, err := devenv.FreePort()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(map[string]string{
		"DATABASE_URL":       testenv.DatabaseURL(t),
		"REDIS_URL":          testenv.RedisURL(t),
		"METRICS_ADDR":       fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"RECOVER_INTERVAL":   "3m",
		"DLQ_DRAIN_INTERVAL": "2m",
		"NOTIFY_INTERVAL":    "5s",
		"BACKLOG_INTERVAL":   "20s",
		runMainEnv:           "1",
	})
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})

	type bounds struct{ interval, timeout float64 }
	want := map[string]bounds{
		"recover_stale":         {180, 180},
		"drain_dlq":             {120, 120},
		"cleanup":               {86400, 3600},
		"watch_reorgs":          {30, 60},
		"deliver_notifications": {5, 60},
		"provider_misses":       {60, 60},
		"backlog_gauges":        {20, (monitor.BacklogTimeoutDefault + time.Second).Seconds()},
		"hot_path_check":        {60, 60},
		"health_check":          {60, 60},
		"health_gauges":         {60, 60},
		"full_reconcile":        {3600, 3600},
	}
	gauge := regexp.MustCompile(`(?m)^settle_job_(interval|timeout)_seconds\{job_name="([a-z_]+)"\} (\S+)$`)
	var got map[string]bounds
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = map[string]bounds{}
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)); err == nil {
			page, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			for _, m := range gauge.FindAllStringSubmatch(string(page), -1) {
				v, err := strconv.ParseFloat(m[3], 64)
				require.NoError(t, err)
				b := got[m[2]]
				if m[1] == "interval" {
					b.interval = v
				} else {
					b.timeout = v
				}
				got[m[2]] = b
			}
		}
		if len(got) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, want, got, "scheduler stderr: %s", stderr.String())
}
