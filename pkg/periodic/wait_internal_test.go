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
	at := func(d time.Duration) time.Time { return start.Add(d) }
	previous := start.Add(-job.Every)

	require.Equal(t, 2*time.Second-300*time.Millisecond+procs.AlignSlack, job.wait(at(300*time.Millisecond), start, false),
		"ran this period: sleeps to the next one's start")
	require.Equal(t, procs.AlignSlack+time.Nanosecond, job.wait(at(2*time.Second-time.Nanosecond), start, false))
	require.Zero(t, job.wait(at(2*time.Second+time.Millisecond), start, false),
		"a run that outlasted its period: the new period runs at once")
	require.Zero(t, job.wait(at(time.Second), time.Time{}, false), "never ran")
	require.Equal(t, job.checkEvery(), job.wait(at(100*time.Millisecond), previous, true),
		"a failed claim is tried again after checkEvery")
	require.Equal(t, 200*time.Millisecond+procs.AlignSlack, job.wait(at(1800*time.Millisecond), previous, true),
		"... or at the next period, if that comes first")
	require.Zero(t, job.wait(at(300*time.Millisecond), start.Add(job.Every), false),
		"the clock stepped back: its current period is tried, the claim decides")

	// Jobs whose periods divide each other wake at the same instants.
	five := Job{Name: "five", Every: 10 * time.Second}
	now := at(1234 * time.Millisecond)
	fiveStart, _ := five.start(now)
	require.Equal(t, now.Add(five.wait(now, fiveStart, false)).UnixNano()%int64(job.Every), int64(procs.AlignSlack))

	daily := Job{Name: "d", Every: 24 * time.Hour, At: time.Hour}
	require.Equal(t, time.Minute, daily.wait(at(0), time.Time{}, false))
	dayStart := time.Date(2027, 3, 28, 0, 0, 0, 0, time.UTC)
	_, due := daily.start(dayStart.Add(59 * time.Minute))
	require.False(t, due, "a daily job is not due before its time of day")
	got, due := daily.start(dayStart.Add(5 * time.Hour))
	require.True(t, due)
	require.Equal(t, dayStart.Add(time.Hour), got, "its period starts at its time of day")
}
