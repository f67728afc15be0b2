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
// each period of each job runs once.
type Periods interface {
	ClaimPeriod(ctx context.Context, job string, period int64, owner string) (bool, error)
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

// period numbers the job's current period: runs at the same period number
// are the same run, whoever attempts them.
func (j Job) period(now time.Time) (int64, bool) {
	if j.At == 0 {
		return now.UnixNano() / int64(j.Every), true
	}
	day := now.UTC().Truncate(24 * time.Hour)
	if now.UTC().Sub(day) < j.At {
		return 0, false
	}
	return day.Unix() / int64(24*time.Hour/time.Second), true
}

// dueTimeout bounds a job's Due question.
const dueTimeout = 5 * time.Second

// checkEvery bounds how long a job waits before it tries again a period
// whose claim failed, and is how often a daily job looks at the clock.
func (j Job) checkEvery() time.Duration {
	if j.At != 0 {
		return time.Minute
	}
	return min(max(j.Every/4, 50*time.Millisecond), 15*time.Second)
}

// wait is how long the job sleeps after a look at the clock at now:
// until its next period starts (every job's periods start at multiples of
// Every since the epoch, so the scheduler's jobs wake together, not each
// on its own ticker), at once if the current period has not run (a run
// that took longer than its period), or checkEvery for a failed claim.
func (j Job) wait(now time.Time, lastRun int64, failed bool) time.Duration {
	if j.At != 0 {
		return j.checkEvery()
	}
	period := now.UnixNano() / int64(j.Every)
	untilNext := procs.UntilAligned(now, j.Every)
	switch {
	case failed:
		return min(untilNext, j.checkEvery())
	case period != lastRun:
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

	runs     *prometheus.CounterVec
	duration *prometheus.HistogramVec
	last     *prometheus.GaugeVec
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
	if reg != nil {
		reg.MustRegister(r.runs, r.duration, r.last)
	}
}

type periodKey struct{}

// JobPeriod is the period a job run claimed (the number the replicas
// race for), as its Run sees it through the context.
func JobPeriod(ctx context.Context) (int64, bool) {
	p, ok := ctx.Value(periodKey{}).(int64)
	return p, ok
}

// Run runs every job until ctx ends, then waits for runs under way.
func (r *Runner) Run(ctx context.Context, jobs []Job) {
	var wg sync.WaitGroup
	for _, j := range jobs {
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
	lastRun := int64(-1)
	for {
		failed := false
		if period, due := j.period(time.Now()); due && period != lastRun {
			// A claim that failed is tried again after checkEvery; a period
			// that ran (or that another replica owns) is done, even if the
			// run failed: the next period runs it again.
			if ran, err := r.tryRun(ctx, j, period); ran || err == nil {
				lastRun = period
			} else {
				failed = true
			}
		}
		timer.Reset(j.wait(time.Now(), lastRun, failed))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// tryRun claims the period (unless the job is local) and runs the job if
// the claim is ours.
func (r *Runner) tryRun(ctx context.Context, j Job, period int64) (ran bool, err error) {
	if j.Due != nil {
		dueCtx, cancel := context.WithTimeout(ctx, dueTimeout)
		due, err := j.Due(dueCtx)
		cancel()
		if err == nil && !due {
			if r.runs != nil {
				r.runs.WithLabelValues(j.Name, "idle").Inc()
				r.last.WithLabelValues(j.Name).SetToCurrentTime()
			}
			return true, nil
		}
	}
	if !j.Local {
		won, err := r.Periods.ClaimPeriod(ctx, j.Name, period, r.Owner)
		if err != nil {
			r.Log.Warn().Err(err).Str("job", j.Name).Msg("could not claim job period")
			return false, err
		}
		if !won {
			return false, nil
		}
	}
	timeout := j.Timeout
	if timeout <= 0 {
		timeout = max(j.Every, time.Minute)
	}
	runCtx, cancel := context.WithTimeout(context.WithValue(ctx, periodKey{}, period), timeout)
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
	} else if r.last != nil {
		r.last.WithLabelValues(j.Name).SetToCurrentTime()
	}
	if r.runs != nil {
		r.runs.WithLabelValues(j.Name, result).Inc()
	}
	event.Str("job", j.Name).Int64("period", period).Str("owner", r.Owner).Bool("local", j.Local).Dur("took", time.Since(started)).Msg("job ran")
	return true, err
}
