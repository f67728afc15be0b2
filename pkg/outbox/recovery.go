package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

// Recovery bounds.
const (
	RecoveryBatchDefault       = 500
	MaxRecoveryAttemptsDefault = 10
	StaleEnqueuedAfterDefault  = 3 * time.Minute
	RecoverIntervalDefault     = 2 * time.Minute
	inspectTimeout             = time.Second
	// recoveryPagesPerRunMax bounds one run to this many pages of
	// BatchMax events; the next run goes on where it stopped.
	recoveryPagesPerRunMax = 20
	// leaseGrace is how long past its expiry an active task's lease is
	// still taken as held (clock skew, a late heartbeat), as asynq's own
	// recoverer allows.
	leaseGrace = 30 * time.Second
)

// TaskInspector is the part of asynq's Inspector recovery needs.
type TaskInspector interface {
	GetTaskInfo(queue, id string) (*asynq.TaskInfo, error)
}

// LeaseReader reads the lease asynq keeps on an active task, which the
// worker holding it extends while it runs.
type LeaseReader interface {
	LeaseExpiry(ctx context.Context, queue, id string) (expiry time.Time, ok bool, err error)
}

// ResumeStore keeps recovery's resume point where every scheduler replica
// sees it; the zero cursor is none.
type ResumeStore interface {
	LoadResume(ctx context.Context) (postgres.StaleCursor, error)
	SaveResume(ctx context.Context, c postgres.StaleCursor) error
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// Stale is the database side of recovery.
type Stale interface {
	RecoverStale(ctx context.Context, staleAfter time.Duration, limit int, after postgres.StaleCursor, decide func(context.Context, postgres.StaleEvent) (postgres.RecoveryAction, string)) (postgres.RecoveryReport, error)
}

// Recovery finds events stuck in 'enqueued' — the queue lost them, a
// worker died holding them on its last retry, or a zombie task sits in
// asynq's active list with no live lease — and sends them back to the outbox
// under a new generation, or to the DLQ after MaxAttempts recoveries.
type Recovery struct {
	Store     Stale
	Inspector TaskInspector
	// Leases tells a zombie (no lease, or an expired one) from a task a
	// live worker holds; nil takes every active task for a zombie.
	Leases LeaseReader
	// Resume shares the resume point between replicas and restarts; nil
	// keeps it in this Recovery only.
	Resume      ResumeStore
	Alerts      Alerter
	Log         zerolog.Logger
	StaleAfter  time.Duration
	MaxAttempts int
	BatchMax    int

	// resume is where the last run stopped at its page bound when there
	// is no Resume store. Runs of one Recovery are sequential (one job).
	resume postgres.StaleCursor

	requeued     prometheus.Counter
	deadLettered prometheus.Counter
	skipped      prometheus.Counter
}

// RegisterMetrics adds recovery's counters to reg.
func (r *Recovery) RegisterMetrics(reg prometheus.Registerer) {
	r.requeued = prometheus.NewCounter(prometheus.CounterOpts{Name: "settle_recovery_requeued_total", Help: "Stuck events sent back to the outbox by stale recovery."})
	r.deadLettered = prometheus.NewCounter(prometheus.CounterOpts{Name: "settle_recovery_dead_lettered_total", Help: "Stuck events dead-lettered after MAX_RECOVERY_ATTEMPTS recoveries."})
	r.skipped = prometheus.NewCounter(prometheus.CounterOpts{Name: "settle_recovery_skipped_total", Help: "Old enqueued events left alone because their task is still waiting in asynq."})
	if reg != nil {
		reg.MustRegister(r.requeued, r.deadLettered, r.skipped)
	}
}

// Run recovers page after page of stale events, oldest first, until a
// short page or recoveryPagesPerRunMax pages. Each page starts after the
// last, so events left alone (their tasks still waiting in the queue) do
// not hide a lost one behind them; a run stopped by the bound leaves the
// next to go on after it.
func (r *Recovery) Run(ctx context.Context) error {
	// Events of one task share one question to asynq per run.
	seen := make(map[string]taskState)
	decide := func(ctx context.Context, s postgres.StaleEvent) (postgres.RecoveryAction, string) {
		return r.decide(ctx, s, seen)
	}
	cursor := r.loadResume(ctx)
	for range recoveryPagesPerRunMax {
		report, err := r.Store.RecoverStale(ctx, r.StaleAfter, r.BatchMax, cursor, decide)
		if err != nil {
			return err
		}
		r.count(report)
		for _, d := range report.DeadLettered {
			r.Alerts.Raise("recovery_dead_letter", alert.Critical, "event dead-lettered after exhausting stale recoveries", map[string]any{
				"event_id": d.EventID, "trace_id": d.TraceID, "attempts": d.Attempt, "error": d.Error,
			})
		}
		if report.Requeued+len(report.DeadLettered) > 0 || report.Failed > 0 {
			r.Log.Info().Int("examined", report.Examined).Int("requeued", report.Requeued).
				Int("dead_lettered", len(report.DeadLettered)).Int("skipped", report.Skipped).Int("failed", report.Failed).
				Msg("stale recovery pass")
		}
		if report.Examined < r.BatchMax {
			r.saveResume(ctx, postgres.StaleCursor{})
			return nil
		}
		cursor = report.Next
	}
	r.saveResume(ctx, cursor)
	r.Log.Warn().Int("pages", recoveryPagesPerRunMax).Int("batch", r.BatchMax).Time("stopped_at", cursor.UpdatedAt).
		Msg("stale recovery stopped at its page bound; the next run goes on from there")
	return nil
}

// loadResume is where this run starts. The cursor orders rows by
// (updated_at, event_id) and a requeued or newly enqueued event gets a
// later updated_at, so an old or lost resume point only delays reaching
// an event until a run ends on a short page and starts again from the
// oldest: none is skipped for good.
func (r *Recovery) loadResume(ctx context.Context) postgres.StaleCursor {
	if r.Resume == nil {
		c := r.resume
		r.resume = postgres.StaleCursor{}
		return c
	}
	c, err := r.Resume.LoadResume(ctx)
	if err != nil {
		r.Log.Warn().Err(err).Msg("stale recovery resume point unreadable; starting from the oldest")
		return postgres.StaleCursor{}
	}
	return c
}

func (r *Recovery) saveResume(ctx context.Context, c postgres.StaleCursor) {
	if r.Resume == nil {
		r.resume = c
		return
	}
	if err := r.Resume.SaveResume(ctx, c); err != nil {
		r.Log.Warn().Err(err).Msg("stale recovery resume point not saved; the next run may start from an older one")
	}
}

func (r *Recovery) count(report postgres.RecoveryReport) {
	if r.requeued == nil {
		return
	}
	r.requeued.Add(float64(report.Requeued))
	r.deadLettered.Add(float64(len(report.DeadLettered)))
	r.skipped.Add(float64(report.Skipped))
}

// decide asks asynq where the event's task is. Waiting, scheduled or
// retrying: the queue still has it, so it is slow, not lost. Active under
// a lease a worker keeps extending: it is being worked on. Active with
// its lease unreadable: left for the next run, as its worker may be
// running it. Missing, archived (asynq gave up silently), active with no
// lease or an expired one (a zombie), or Redis unreachable: recover it.
func (r *Recovery) decide(ctx context.Context, s postgres.StaleEvent, seen map[string]taskState) (postgres.RecoveryAction, string) {
	id := s.TaskID
	if id == "" {
		id = task.TaskID(s.Event)
	}
	state, ok := seen[id]
	if !ok {
		state = r.ask(ctx, id)
		seen[id] = state
	}
	info, err := state.info, state.err
	if err == nil {
		switch info.State {
		case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry, asynq.TaskStateAggregating:
			return postgres.RecoverySkip, ""
		case asynq.TaskStateActive:
			if state.leaseErr != nil {
				// Requeued now, a live worker and a second task would
				// both do the work; a zombie only waits a period more.
				r.Log.Warn().Str("event_id", s.Event.ID).Str("task_id", id).Err(state.leaseErr).
					Msg("stale event's task is active and its lease unreadable; left for the next run")
				return postgres.RecoverySkip, ""
			}
			if state.leased && time.Now().Before(state.leaseExpiry.Add(leaseGrace)) {
				return postgres.RecoverySkip, ""
			}
		}
	}
	why := "task missing from the queue"
	switch {
	case err != nil && !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound):
		why = "queue unreachable: " + err.Error()
	case err == nil && info.State == asynq.TaskStateActive && state.leased:
		why = "task active, its lease expired at " + state.leaseExpiry.UTC().Format(time.RFC3339)
	case err == nil && info.State == asynq.TaskStateActive:
		why = "task active with no lease"
	case err == nil:
		why = "task " + info.State.String() + " in the queue"
	}
	if s.RetryCount >= r.MaxAttempts {
		return postgres.RecoveryDeadLetter, fmt.Sprintf("stuck in enqueued after %d recoveries (%s)", s.RetryCount, why)
	}
	r.Log.Warn().Str("event_id", s.Event.ID).Str("trace_id", s.Event.TraceID).Int("retry_count", s.RetryCount+1).
		Str("reason", why).Msg("stale event back to the outbox")
	return postgres.RecoveryRequeue, ""
}

// taskState is what asynq said about a task, and about its lease when it
// is active.
type taskState struct {
	info        *asynq.TaskInfo
	err         error
	leased      bool
	leaseExpiry time.Time
	leaseErr    error
}

// ask reads the task's state and, for an active task, its lease. The
// Inspector's GetTaskInfo reports no lease (IsOrphaned is set by its
// list calls only), hence the second read.
func (r *Recovery) ask(ctx context.Context, id string) taskState {
	var state taskState
	state.info, state.err = r.inspect(ctx, id)
	if state.err != nil || state.info.State != asynq.TaskStateActive {
		return state
	}
	if r.Leases == nil {
		return state // no lease reader: every active task is a zombie
	}
	lctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	state.leaseExpiry, state.leased, state.leaseErr = r.Leases.LeaseExpiry(lctx, task.QueuePayments, id)
	return state
}

// inspect bounds the Inspector call, which takes no context.
func (r *Recovery) inspect(ctx context.Context, id string) (*asynq.TaskInfo, error) {
	type answer struct {
		info *asynq.TaskInfo
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		info, err := r.Inspector.GetTaskInfo(task.QueuePayments, id)
		ch <- answer{info, err}
	}()
	select {
	case a := <-ch:
		return a.info, a.err
	case <-time.After(inspectTimeout):
		return nil, errors.New("asynq inspector timed out")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
