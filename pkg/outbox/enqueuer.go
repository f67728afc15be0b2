// Package outbox moves committed events from PostgreSQL's outbox into
// asynq: the enqueuer (claim and commit, then enqueue, then wake the
// workers), and stale recovery, which asks asynq about old 'enqueued'
// events outside any transaction and sends the lost ones back.
package outbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/tracing"
)

// Enqueuer bounds.
const (
	// EnqueueBatchDefault is how many pending events one claim takes.
	EnqueueBatchDefault = 500
	// DueBatchDefault is how many waiting deposits one claim re-checks.
	DueBatchDefault = 100
	// TaskEventsDefault is how many events one payment task carries at
	// most: a claim is cut into tasks of this size, which spares asynq
	// (and Redis) a task's worth of work for every event but one.
	TaskEventsDefault = 32
	// QueueDepthMaxDefault caps the tasks waiting in asynq: beyond it the
	// events wait, durable, in PostgreSQL, and Redis memory stays bounded
	// (to this many times TaskEventsDefault events).
	QueueDepthMaxDefault = 1_000
	// EnqueueConcurrency is how many enqueue calls run at once.
	EnqueueConcurrency = 8
	// probeBatch is the claim size while Redis refuses enqueues: a trickle
	// that finds out when it is back without stranding the whole backlog.
	probeBatch = 1
	// drainRoundsMax bounds one wake-up's claim loop; the next wake-up or
	// poll continues.
	drainRoundsMax = 100
	enqueueTimeout = 5 * time.Second
	// ClaimTimeoutDefault bounds one claim. Run's context has no
	// deadline: a PostgreSQL that stops answering mid-claim without a
	// reset (failover, partition) held the enqueuer, wake-ups and polls
	// alike, until the kernel gave the socket up, many minutes later.
	ClaimTimeoutDefault = 10 * time.Second
)

// Outbox is the database side of the enqueuer.
type Outbox interface {
	ClaimOutbox(ctx context.Context, pendingMax, dueMax, taskMax int) ([]postgres.Claimed, error)
}

// EnqueuerOptions configure an Enqueuer.
type EnqueuerOptions struct {
	Outbox       Outbox
	Client       *asynq.Client
	Redis        redis.UniversalClient
	Log          zerolog.Logger
	PollInterval time.Duration
	BatchMax     int
	DueMax       int
	TaskEvents   int // events per task at most
	DepthMax     int
	// ClaimTimeout bounds one claim (ClaimTimeoutDefault when zero).
	ClaimTimeout time.Duration
	Registerer   prometheus.Registerer
}

// Enqueuer moves committed pending events into asynq: claim and commit
// first, then enqueue. A worker can therefore never see a task before the
// database says 'enqueued', and an enqueue that fails leaves the row
// 'enqueued' for stale recovery. It is not released to 'pending' as the
// api's hand-off does: the release wakes this enqueuer (pg_notify), which
// would claim and fail again at once while Redis is down, or for good on
// a task that cannot be built.
type Enqueuer struct {
	o       EnqueuerOptions
	wake    chan struct{}
	failing atomic.Bool

	claimed  prometheus.Counter
	enqueued *prometheus.CounterVec
	depth    prometheus.Gauge
	depthMax prometheus.Gauge
	held     prometheus.Counter
}

// NewEnqueuer builds an enqueuer.
func NewEnqueuer(o EnqueuerOptions) *Enqueuer {
	if o.BatchMax <= 0 {
		o.BatchMax = EnqueueBatchDefault
	}
	if o.DueMax <= 0 {
		o.DueMax = DueBatchDefault
	}
	if o.TaskEvents <= 0 {
		o.TaskEvents = TaskEventsDefault
	}
	if o.DepthMax <= 0 {
		o.DepthMax = QueueDepthMaxDefault
	}
	if o.ClaimTimeout <= 0 {
		o.ClaimTimeout = ClaimTimeoutDefault
	}
	e := &Enqueuer{
		o:    o,
		wake: make(chan struct{}, 1),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_outbox_claimed_total", Help: "Events the enqueuer moved from pending (or due for a finality re-check) to enqueued.",
		}),
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_outbox_enqueued_total", Help: "Enqueue attempts into asynq, by result (ok, duplicate, error).",
		}, []string{"result"}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_queue_depth", Help: "Payment tasks waiting in asynq, as the enqueuer last saw it.",
		}),
		// The alert on a deep queue is a share of this bound: a fixed
		// depth above a lowered QUEUE_DEPTH_MAX could never be reached.
		depthMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_queue_depth_max", Help: "QUEUE_DEPTH_MAX: the payment tasks the enqueuer lets wait in asynq (settle_queue_depth stops there).",
		}),
		held: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_outbox_backpressure_total", Help: "Claims skipped or shrunk because the queue was at its depth bound.",
		}),
	}
	e.depthMax.Set(float64(o.DepthMax))
	if o.Registerer != nil {
		o.Registerer.MustRegister(e.claimed, e.enqueued, e.depth, e.depthMax, e.held)
	}
	return e
}

// Wake asks for a claim round soon; it never blocks.
func (e *Enqueuer) Wake() {
	procs.Active() // new events end the GOMAXPROCS controller's idle period
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run claims and enqueues on every wake-up and every poll interval until
// ctx ends.
func (e *Enqueuer) Run(ctx context.Context) {
	ticker := time.NewTicker(e.o.PollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-ticker.C:
		}
		for round := 0; round < drainRoundsMax && ctx.Err() == nil; round++ {
			full, err := e.Once(ctx)
			if err != nil {
				e.o.Log.Warn().Err(err).Msg("enqueue round failed")
				break
			}
			if !full {
				break
			}
		}
	}
}

// Once runs one claim-and-enqueue round; full reports that it claimed a
// whole batch, so there is probably more.
func (e *Enqueuer) Once(ctx context.Context) (full bool, err error) {
	pendingMax, dueMax := e.o.BatchMax, e.o.DueMax
	depth, depthErr := e.o.Redis.LLen(ctx, task.PendingListKey(task.QueuePayments)).Result()
	switch {
	case depthErr != nil || e.failing.Load():
		// Redis is in trouble: probe with one event. Claimed events that
		// cannot be enqueued wait for stale recovery, which dead-letters
		// them after MAX_RECOVERY_ATTEMPTS; the rest stay safely pending.
		pendingMax, dueMax = probeBatch, 0
	default:
		e.depth.Set(float64(depth))
		room := e.o.DepthMax - int(depth)
		if room <= 0 {
			e.held.Inc()
			return false, nil
		}
		if room < pendingMax+dueMax {
			e.held.Inc()
			pendingMax = min(pendingMax, room)
			dueMax = min(dueMax, room-pendingMax)
		}
	}
	claim := claimWindow{start: time.Now()}
	// A claim cut short after its commit leaves its rows 'enqueued'
	// without a task: stale recovery sends them, as after any lost reply.
	claimCtx, cancelClaim := context.WithTimeout(ctx, e.o.ClaimTimeout)
	claimed, err := e.o.Outbox.ClaimOutbox(claimCtx, pendingMax, dueMax, e.o.TaskEvents)
	cancelClaim()
	if err != nil {
		return false, err
	}
	claim.end = time.Now()
	e.claimed.Add(float64(len(claimed)))
	// The claim has committed: its events are 'enqueued' and only this
	// round can give them a task. A stop (SIGTERM cancels ctx) must not
	// strand them until stale recovery, so the enqueues outlive ctx,
	// each still bounded by enqueueTimeout.
	ctx = context.WithoutCancel(ctx)
	tasks, failed := e.enqueueAll(ctx, claimed, claim)
	failures := len(failed)
	e.failing.Store(failures > 0 && failures == len(claimed))
	if failures < len(claimed) {
		// Workers waiting on an empty queue look now, not at their next poll.
		wakeCtx, cancel := context.WithTimeout(ctx, enqueueTimeout)
		defer cancel()
		if err := PublishWakeFor(wakeCtx, e.o.Redis, tasks); err != nil {
			e.o.Log.Debug().Err(err).Msg("wake-up not published; workers find the tasks at their next poll")
		}
	}
	return len(claimed) >= pendingMax && failures == 0, nil
}

// enqueueAll hands the claimed events to asynq, one task per task id,
// with bounded concurrency, and returns how many tasks it enqueued and
// the events it could not.
func (e *Enqueuer) enqueueAll(ctx context.Context, claimed []postgres.Claimed, claim claimWindow) (tasks int, failed []postgres.Claimed) {
	var mu sync.Mutex
	one := func(events []postgres.Claimed) {
		err := e.enqueue(ctx, events, claim)
		mu.Lock()
		if err == nil {
			tasks++
		} else {
			failed = append(failed, events...)
		}
		mu.Unlock()
		if err != nil {
			for _, c := range events {
				e.o.Log.Warn().Err(err).Str("event_id", c.Event.ID).Str("trace_id", c.Event.TraceID).
					Msg("enqueue failed; the event goes back to the outbox")
			}
		}
	}
	all := tasksOf(claimed)
	if len(all) == 1 {
		// A trickle's one task: no goroutine to hand it to and wait for.
		one(all[0])
		return tasks, failed
	}
	slots := make(chan struct{}, EnqueueConcurrency)
	var wg sync.WaitGroup
	for _, events := range all {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			one(events)
		}()
	}
	wg.Wait()
	return tasks, failed
}

// tasksOf groups claimed events by task id, in claim order; events with
// no task id travel alone.
func tasksOf(claimed []postgres.Claimed) [][]postgres.Claimed {
	var tasks [][]postgres.Claimed
	index := make(map[string]int)
	for _, c := range claimed {
		if c.TaskID == "" {
			tasks = append(tasks, []postgres.Claimed{c})
			continue
		}
		i, ok := index[c.TaskID]
		if !ok {
			i = len(tasks)
			index[c.TaskID] = i
			tasks = append(tasks, nil)
		}
		tasks[i] = append(tasks[i], c)
	}
	return tasks
}

func (e *Enqueuer) enqueue(ctx context.Context, events []postgres.Claimed, claim claimWindow) (err error) {
	spans := traceEnqueue(ctx, events, claim)
	defer func() {
		for _, span := range spans {
			tracing.End(span, err)
		}
	}()
	t, opts, err := task.NewPaymentBatch(events)
	if err != nil {
		e.enqueued.WithLabelValues("error").Inc()
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, enqueueTimeout)
	defer cancel()
	_, err = e.o.Client.EnqueueContext(ctx, t, opts...)
	switch {
	case err == nil:
		e.enqueued.WithLabelValues("ok").Inc()
		return nil
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// The same task is already queued: one is enough.
		e.enqueued.WithLabelValues("duplicate").Inc()
		return nil
	default:
		e.enqueued.WithLabelValues("error").Inc()
		return err
	}
}

// claimWindow is when the claim that took a task's events ran.
type claimWindow struct{ start, end time.Time }

// traceEnqueue gives each event of a task its own claim and enqueue spans
// in the event's own trace (a claim serves many traces), and points the
// event's traceparent at its enqueue span, where the worker goes on. Off,
// it does nothing and the stored traceparents travel as they are.
func traceEnqueue(ctx context.Context, events []postgres.Claimed, claim claimWindow) []trace.Span {
	if !tracing.Enabled() {
		return nil
	}
	spans := make([]trace.Span, len(events))
	for i := range events {
		c := &events[i]
		parent := tracing.ForEvent(ctx, c.TraceParent, c.Event.TraceID)
		claimCtx, claimSpan := tracing.StartAt(parent, "outbox.claim", tracing.Internal, claim.start)
		claimSpan.SetAttributes(attribute.String("settle.event_id", c.Event.ID), attribute.String("settle.task_id", c.TaskID),
			attribute.Int("settle.generation", c.Event.Generation))
		claimSpan.End(trace.WithTimestamp(claim.end))
		if !trace.SpanContextFromContext(parent).IsValid() {
			parent = claimCtx // no stored span to hang both on: one chain
		}
		enqueueCtx, span := tracing.Start(parent, "queue.enqueue", tracing.Producer)
		span.SetAttributes(attribute.String("settle.event_id", c.Event.ID), attribute.String("settle.task_id", c.TaskID))
		c.TraceParent = tracing.Traceparent(enqueueCtx)
		spans[i] = span
	}
	return spans
}
