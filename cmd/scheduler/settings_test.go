package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// TestListenURLIsChecked: a malformed DATABASE_LISTEN_URL stops the
// scheduler at start naming the setting (else LISTEN fails forever while
// the enqueuer runs on its poll alone), without repeating the password;
// unset, the listener uses DATABASE_URL.
func TestListenURLIsChecked(t *testing.T) {
	for _, bad := range []string{
		"postgres://settle:hunter2@db:notaport/settle",
		"postgres://settle:hunter2@db/settle?sslmode=sometimes",
		"http://db.example/settle",
	} {
		env := config.FromMap(map[string]string{
			"DATABASE_URL":        "postgres://settle@db/settle",
			"DATABASE_LISTEN_URL": bad,
		})
		readSettings(env)
		require.Len(t, env.Errs(), 1, "DATABASE_LISTEN_URL=%q", bad)
		require.ErrorContains(t, env.Err(), "setting DATABASE_LISTEN_URL", "DATABASE_LISTEN_URL=%q is accepted", bad)
		require.NotContains(t, env.Err().Error(), "hunter2")
	}

	env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@db/settle"})
	require.Equal(t, "postgres://settle@db/settle", readSettings(env).ListenURL)
	require.NoError(t, env.Err())
	env = config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@pgbouncer/settle", "DATABASE_LISTEN_URL": "postgres://settle@db/settle"})
	require.Equal(t, "postgres://settle@db/settle", readSettings(env).ListenURL)
	require.NoError(t, env.Err())
}

// TestDurationSettingsAreBounded: every interval and timeout of the
// scheduler is refused at start outside its bounds, naming the setting.
// Unbounded, RECOVER_INTERVAL=500ns started a scheduler whose every
// claim of the job was refused (a period under 1µs): stale recovery never
// ran, and no run error told SettleJobFailing. 2000h (a slip for 2000s)
// ran a job about once in 83 days, its alert bounds scaled to match; a
// SCAN_PASS_TIMEOUT of hours held a killed replica's cursor lease that
// long.
func TestDurationSettingsAreBounded(t *testing.T) {
	for name, c := range map[string]struct{ low, ok, high string }{
		"POLL_INTERVAL":           {"500ns", "200ms", "25h"},
		"RECOVER_INTERVAL":        {"500ns", "1s", "2000h"},
		"DLQ_DRAIN_INTERVAL":      {"1us", "300ms", "25h"},
		"REORG_WATCH_INTERVAL":    {"5ms", "300ms", "25h"},
		"NOTIFY_INTERVAL":         {"1ms", "300ms", "25h"},
		"HOT_PATH_CHECK_INTERVAL": {"500ns", "1m", "25h"},
		"HEALTH_CHECK_INTERVAL":   {"500ns", "1m", "25h"},
		"PROVIDER_MISS_INTERVAL":  {"500ns", "1m", "25h"},
		"BACKLOG_INTERVAL":        {"500ns", "15s", "25h"},
		"BACKLOG_TIMEOUT":         {"500ns", "5s", "2h"},
		"SCAN_INTERVAL":           {"500ns", "50ms", "25h"},
		"SCAN_PASS_TIMEOUT":       {"500ms", "3s", "2h"},
		"STALE_ENQUEUED_AFTER":    {"50ms", "100ms", "25h"},
		"CLEANUP_BATCH_TIMEOUT":   {"500ns", "30s", "2h"},
		"PARTITION_LOCK_TIMEOUT":  {"500ns", "100ms", "1m"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, v := range []string{c.low, c.high} {
				env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@db/settle", name: v})
				readSettings(env)
				require.ErrorContains(t, env.Err(), "setting "+name, "%s=%s is accepted", name, v)
			}
			env := config.FromMap(map[string]string{"DATABASE_URL": "postgres://settle@db/settle", name: c.ok})
			readSettings(env)
			require.NoError(t, env.Err(), "%s=%s", name, c.ok)
		})
	}
}

// TestWindowSettingsAreBounded: the windows and the retention are refused
// at start outside their bounds and taken at both edges. Unbounded,
// PROCESSED_RETENTION=1h dropped the outcome records of keys an hour old.
func TestWindowSettingsAreBounded(t *testing.T) {
	for name, c := range map[string]struct{ below, min, max, above, interval string }{
		// The window's floor is the interval's, and it may not be shorter
		// than the interval (TestHotPathWindowCoversItsInterval).
		"HOT_PATH_CHECK_WINDOW": {"9ms", "10ms", "24h", "24h0m0.001s", "10ms"},
		"PROVIDER_MISS_GRACE":   {"999us", "1ms", "24h", "24h0m0.001s", ""},
		"PROCESSED_RETENTION":   {"23h59m59s", "24h", "8760h", "8760h0m1s", ""},
	} {
		t.Run(name, func(t *testing.T) {
			read := func(v string) error {
				m := map[string]string{"DATABASE_URL": "postgres://settle@db/settle", name: v}
				if c.interval != "" {
					m["HOT_PATH_CHECK_INTERVAL"] = c.interval
				}
				env := config.FromMap(m)
				readSettings(env)
				return env.Err()
			}
			for _, v := range []string{c.below, c.above} {
				require.ErrorContains(t, read(v), "setting "+name, "%s=%s is accepted", name, v)
			}
			for _, v := range []string{c.min, c.max} {
				require.NoError(t, read(v), "%s=%s", name, v)
			}
		})
	}
}

// TestHotPathWindowCoversItsInterval: a run checks the balances touched
// within HOT_PATH_CHECK_WINDOW, so a window shorter than the interval
// left the balances touched between two runs to the daily full pass.
// Unset, the window covers two intervals (the 10m default while that is
// more); set shorter than the interval, it is refused.
func TestHotPathWindowCoversItsInterval(t *testing.T) {
	read := func(m map[string]string) (monitorSettings, error) {
		m["DATABASE_URL"] = "postgres://settle@db/settle"
		env := config.FromMap(m)
		s := readMonitorSettings(env)
		return s, env.Err()
	}
	s, err := read(map[string]string{})
	require.NoError(t, err)
	require.Equal(t, time.Minute, s.HotPathInterval)
	require.Equal(t, 10*time.Minute, s.HotPathWindow, "the defaults as before")

	s, err = read(map[string]string{"HOT_PATH_CHECK_INTERVAL": "1h"})
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, s.HotPathWindow)
	s, err = read(map[string]string{"HOT_PATH_CHECK_INTERVAL": "24h"})
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, s.HotPathWindow, "at most the window's ceiling")

	_, err = read(map[string]string{"HOT_PATH_CHECK_INTERVAL": "1h", "HOT_PATH_CHECK_WINDOW": "10m"})
	require.ErrorContains(t, err, "HOT_PATH_CHECK_WINDOW")
	require.ErrorContains(t, err, "shorter than HOT_PATH_CHECK_INTERVAL")
	_, err = read(map[string]string{"HOT_PATH_CHECK_INTERVAL": "1h", "HOT_PATH_CHECK_WINDOW": "1h"})
	require.NoError(t, err)
}
