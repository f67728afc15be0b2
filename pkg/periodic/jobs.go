// Package periodic runs the scheduler's periodic jobs, each period of a
// job once across every replica (the period is claimed in PostgreSQL).
package periodic

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/procs"
)

// Periods claims job periods so that, across every scheduler replica,
// each period of each job runs once. The period is the one current on the
// store's clock (its start is returned, won or not), so a replica whose
// clock is off, or a changed Every, cannot block the others.
type Periods interface {
	ClaimPeriod(ctx context.Context, job string, every, at time.Duration, owner string) (start time.Time, won bool, err error)
}

// Job is a periodic job of the scheduler.
type Job struct {
	Name string
	// Every is the period. A daily job sets Every to 24h and At to its
	// time of day (UTC); it fires at the first check past At.
	Every time.Duration
	At    time.Duration
	// Timeout bounds one run.
	Timeout time.Duration
	// Local jobs run on every replica, each period, without a claim: for
	// read-only work whose result lives in the replica (a gauge).
	Local bool
	// Due, when set, is asked before the claim: a period it finds with
	// nothing to do is passed over without a claim (the claim is a
	// durable write; Due should be a read). An error runs the job as
	// usual, which finds out for itself.
	Due func(ctx context.Context) (bool, error)
	Run func(ctx context.Context) error
}

// start is when the job's current period began on this replica's clock,
// and whether it is due: a daily job is not before its time of day. The
// claim decides on the database's clock; this only schedules the tries.
func (j Job) start(now time.Time) (time.Time, bool) {
	if j.At == 0 {
		return time.Unix(0, now.UnixNano()/int64(j.Every)*int64(j.Every)), true
	}
	day := now.UTC().Truncate(24 * time.Hour)
	if now.UTC().Sub(day) < j.At {
		return time.Time{}, false
	}
	return day.Add(j.At), true
}

// timeout bounds one run: Timeout, else the period (a minute at least).
func (j Job) timeout() time.Duration {
	if j.Timeout > 0 {
		return j.Timeout
	}
	return max(j.Every, time.Minute)
}

// dueTimeout bounds a job's Due question.
const dueTimeout = 5 * time.Second

// claimTimeout bounds a period's claim. The runner's context has no
// deadline: a PostgreSQL that stops answering mid-claim without a reset
// (failover, partition) held the job's loop until the kernel gave the
// socket up, many minutes later. A claim cut after its commit loses that
// period, as after any lost reply; the next one runs.
const claimTimeout = 5 * time.Second

// checkEvery bounds how long a job waits before it tries again a period
// whose claim failed, and is how often a daily job looks at the clock.
func (j Job) checkEvery() time.Duration {
	if j.At != 0 {
		return time.Minute
	}
	return min(max(j.Every/4, 50*time.Millisecond), 15*time.Second)
}

// wait is how long the job sleeps after a look at the clock at now, its
// last period done having started at lastRun: until its next period
// starts (every job's periods start at multiples of Every since the
// epoch, so the scheduler's jobs wake together, not each on its own
// ticker), at once if the current period has not run (a run that took
// longer than its period), or checkEvery for a failed claim.
func (j Job) wait(now, lastRun time.Time, failed bool) time.Duration {
	if j.At != 0 {
		return j.checkEvery()
	}
	start, _ := j.start(now)
	untilNext := procs.UntilAligned(now, j.Every)
	switch {
	case failed:
		return min(untilNext, j.checkEvery())
	case !start.Equal(lastRun):
		return 0
	}
	return untilNext
}

// Runner runs jobs, claiming each period in PostgreSQL first. asynq's own
// Scheduler has no leader election (two replicas fire twice); a claimed
// period cannot be claimed again.
type Runner struct {
	Periods Periods
	Owner   string
	Log     zerolog.Logger

	clock func() time.Time // the replica's clock; time.Now when nil (tests set it)
	// claimWithin bounds a claim; claimTimeout when zero (tests set it).
	claimWithin time.Duration

	runs      *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	last      *prometheus.GaugeVec
	lastError *prometheus.GaugeVec
	interval  *prometheus.GaugeVec
	timeout   *prometheus.GaugeVec
}

// RegisterMetrics adds the runner's metrics to reg. The label is job_name,
// not job: Prometheus's own job label would shadow it.
func (r *Runner) RegisterMetrics(reg prometheus.Registerer) {
	r.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settle_job_runs_total", Help: "Scheduler job runs by job and result (ok, error; idle: passed over, nothing due).",
	}, []string{"job_name", "result"})
	r.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "settle_job_duration_seconds", Help: "Scheduler job run time.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"job_name"})
	r.last = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "settle_job_last_success_timestamp_seconds", Help: "When each job last succeeded on this replica.",
	}, []string{"job_name"})
	// The alert on a failing job sizes its lateness from these: a success
	// is overdue a period and a whole run after the last one, whatever
	// the job (seconds for some, a day for the cleanup).
	r.lastError = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "settle_job_last_error_timestamp_seconds", Help: "When each job last failed on this replica.",
	}, []string{"job_name"})
	r.interval = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "settle_job_interval_seconds", Help: "Each job's period (86400 for a daily job).",
	}, []string{"job_name"})
	r.timeout = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "settle_job_timeout_seconds", Help: "The bound of one run of each job.",
	}, []string{"job_name"})
	if reg != nil {
		reg.MustRegister(r.runs, r.duration, r.last, r.lastError, r.interval, r.timeout)
	}
}

type periodKey struct{}

// JobPeriod is the start of the period a job run claimed (what the
// replicas race for), as its Run sees it through the context.
func JobPeriod(ctx context.Context) (time.Time, bool) {
	p, ok := ctx.Value(periodKey{}).(time.Time)
	return p, ok
}

// WithJobPeriod is ctx as a job run for the period starting at start sees
// it: what the runner gives a job, for code that runs one outside it.
func WithJobPeriod(ctx context.Context, start time.Time) context.Context {
	return context.WithValue(ctx, periodKey{}, start)
}

// Run runs every job until ctx ends, then waits for runs under way.
func (r *Runner) Run(ctx context.Context, jobs []Job) {
	var wg sync.WaitGroup
	for _, j := range jobs {
		if r.interval != nil {
			r.interval.WithLabelValues(j.Name).Set(j.Every.Seconds())
			r.timeout.WithLabelValues(j.Name).Set(j.timeout().Seconds())
		}
		wg.Add(1)
		go func(j Job) {
			defer wg.Done()
			r.loop(ctx, j)
		}(j)
	}
	wg.Wait()
}

func (r *Runner) loop(ctx context.Context, j Job) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var lastRun time.Time // on this replica's clock
	for {
		failed := false
		if start, due := j.start(r.now()); due && !start.Equal(lastRun) {
			// A claim that failed is tried again after checkEvery; a period
			// that ran (or that another replica owns) is done, even if the
			// run failed: the next period runs it again. A claim answered
			// with an earlier period is the database's clock lagging ours:
			// our period has not begun there yet, so it is asked again soon.
			done, ran, err := r.tryRun(ctx, j, start)
			if (err != nil && !ran) || done.Before(start) {
				failed = true
			} else {
				lastRun = start
			}
		}
		timer.Reset(j.wait(r.now(), lastRun, failed))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// now is the replica's clock.
func (r *Runner) now() time.Time {
	if r.clock != nil {
		return r.clock()
	}
	return time.Now()
}

// tryRun claims the period (unless the job is local) and runs the job if
// the claim is ours. period is the replica's idea of the current period;
// done is the one the claim was for (the store's), which a lost claim
// leaves to whoever won it.
func (r *Runner) tryRun(ctx context.Context, j Job, period time.Time) (done time.Time, ran bool, err error) {
	if j.Due != nil {
		dueCtx, cancel := context.WithTimeout(ctx, dueTimeout)
		due, err := j.Due(dueCtx)
		cancel()
		if err == nil && !due {
			if r.runs != nil {
				r.runs.WithLabelValues(j.Name, "idle").Inc()
				r.last.WithLabelValues(j.Name).SetToCurrentTime()
			}
			return period, true, nil
		}
	}
	if !j.Local {
		within := r.claimWithin
		if within <= 0 {
			within = claimTimeout
		}
		claimCtx, cancel := context.WithTimeout(ctx, within)
		start, won, err := r.Periods.ClaimPeriod(claimCtx, j.Name, j.Every, j.At, r.Owner)
		cancel()
		if err != nil {
			r.Log.Warn().Err(err).Str("job", j.Name).Msg("could not claim job period")
			return time.Time{}, false, err
		}
		if !won {
			return start, false, nil
		}
		period = start
	}
	runCtx, cancel := context.WithTimeout(WithJobPeriod(ctx, period), j.timeout())
	defer cancel()
	started := time.Now()
	err = j.Run(runCtx)
	if r.runs != nil {
		r.duration.WithLabelValues(j.Name).Observe(time.Since(started).Seconds())
	}
	event := r.Log.Info()
	result := "ok"
	if err != nil {
		result = "error"
		event = r.Log.Warn().Err(err)
		if r.lastError != nil {
			r.lastError.WithLabelValues(j.Name).SetToCurrentTime()
		}
	} else if r.last != nil {
		r.last.WithLabelValues(j.Name).SetToCurrentTime()
	}
	if r.runs != nil {
		r.runs.WithLabelValues(j.Name, result).Inc()
	}
	event.Str("job", j.Name).Time("period", period).Str("owner", r.Owner).Bool("local", j.Local).Dur("took", time.Since(started)).Msg("job ran")
	return period, true, err
}
