package periodic

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/procs"
)

// TestJobWaitsForItsNextPeriod: a job sleeps until its next period
// starts, not on a ticker of its own; it goes at once when the current
// period has not run, and tries a failed claim again within checkEvery.
func TestJobWaitsForItsNextPeriod(t *testing.T) {
	job := Job{Name: "j", Every: 2 * time.Second}
	start := time.Unix(1_800_000_000, 0) // a period start: a multiple of 2 s
	period := start.UnixNano() / int64(job.Every)
	at := func(d time.Duration) time.Time { return start.Add(d) }

	require.Equal(t, 2*time.Second-300*time.Millisecond+procs.AlignSlack, job.wait(at(300*time.Millisecond), period, false),
		"ran this period: sleeps to the next one's start")
	require.Equal(t, procs.AlignSlack+time.Nanosecond, job.wait(at(2*time.Second-time.Nanosecond), period, false))
	require.Zero(t, job.wait(at(2*time.Second+time.Millisecond), period, false),
		"a run that outlasted its period: the new period runs at once")
	require.Zero(t, job.wait(at(time.Second), -1, false), "never ran")
	require.Equal(t, job.checkEvery(), job.wait(at(100*time.Millisecond), period-1, true),
		"a failed claim is tried again after checkEvery")
	require.Equal(t, 200*time.Millisecond+procs.AlignSlack, job.wait(at(1800*time.Millisecond), period-1, true),
		"... or at the next period, if that comes first")

	// Jobs whose periods divide each other wake at the same instants.
	five := Job{Name: "five", Every: 10 * time.Second}
	now := at(1234 * time.Millisecond)
	require.Equal(t, now.Add(five.wait(now, now.UnixNano()/int64(five.Every), false)).UnixNano()%int64(job.Every), int64(procs.AlignSlack))

	daily := Job{Name: "d", Every: 24 * time.Hour, At: time.Hour}
	require.Equal(t, time.Minute, daily.wait(at(0), 0, false))
}
