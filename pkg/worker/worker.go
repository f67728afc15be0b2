// Package worker is the asynq side of the worker process: the handlers
// that take a task through the finality gate to the ledger, the batcher
// that turns concurrent tasks into group commits, the waker that ends an
// idle dequeue's wait, and the asynq server's retry policy.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/tracing"
)

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// DeadLetters is the two-level DLQ.
type DeadLetters interface {
	FailEvent(ctx context.Context, letter payment.DeadLetter) dlq.Outcome
	Record(ctx context.Context, letter payment.DeadLetter) dlq.Outcome
}

// Gate decides whether a deposit may be credited now (finality), and
// follows credited ones for reorgs. Nil: tx hashes are trusted.
type Gate interface {
	// Check returns the item to apply, or nil when the event was parked or
	// decided without the ledger (waiting for finality, reverted, ...).
	Check(ctx context.Context, item postgres.LedgerItem) (*postgres.LedgerItem, error)
	// WatchReorgs runs one pass over credited, not yet final deposits.
	WatchReorgs(ctx context.Context) error
}

// Rechecker asks the chain again about a deposit and records the
// answer (finality.Rechecker).
type Rechecker interface {
	Recheck(ctx context.Context, eventID, who string) (postgres.Recheck, error)
}

// Worker handles every task type of the worker process.
type Worker struct {
	log     zerolog.Logger
	batcher *Batcher
	dlq     DeadLetters
	alerts  Alerter
	gate    Gate
	notify  func(ctx context.Context) error
	// rechecker: nil without an RPC.
	rechecker Rechecker
	metrics   *workerMetrics

	contention       redis.UniversalClient
	contentionWindow time.Duration
}

// WorkerOptions wire a Worker.
type WorkerOptions struct {
	Log         zerolog.Logger
	Batcher     *Batcher
	DeadLetters DeadLetters
	Alerts      Alerter
	Gate        Gate                            // optional
	Notify      func(ctx context.Context) error // optional: delivers due notifications
	// Rechecker runs the rechecks an api without an RPC hands over
	// (finality.Rechecker); nil without an RPC here either.
	Rechecker  Rechecker
	Registerer prometheus.Registerer
	// Redis keeps each task's first contention failure; with
	// ContentionWindow, contention spends no budget for that long from it
	// (forgiveContention). Nil or 0: it spends the budget at once.
	Redis            redis.UniversalClient
	ContentionWindow time.Duration
}

// NewWorker builds the task handler.
func NewWorker(o WorkerOptions) *Worker {
	return &Worker{
		log: o.Log, batcher: o.Batcher, dlq: o.DeadLetters, alerts: o.Alerts, gate: o.Gate, notify: o.Notify, rechecker: o.Rechecker,
		metrics:    newWorkerMetrics(o.Registerer),
		contention: o.Redis, contentionWindow: o.ContentionWindow,
	}
}

// ProcessTask implements asynq.Handler.
func (w *Worker) ProcessTask(ctx context.Context, t *asynq.Task) error {
	procs.Active() // a task ends the GOMAXPROCS controller's idle period
	switch t.Type() {
	case task.TypePayment:
		return w.paymentTask(ctx, t)
	case task.TypeWatchReorgs:
		if w.gate == nil {
			return nil
		}
		return w.maintenance(ctx, t.Type(), w.gate.WatchReorgs)
	case task.TypeNotify:
		if w.notify == nil {
			return nil
		}
		return w.maintenance(ctx, t.Type(), w.notify)
	case task.TypeRecheck:
		return w.maintenance(ctx, t.Type(), func(ctx context.Context) error { return w.recheck(ctx, t.Payload()) })
	}
	// A type this worker does not know can never succeed: record it and
	// do not retry.
	w.metrics.tasks.WithLabelValues(t.Type(), "unknown_type").Inc()
	out := w.dlq.Record(ctx, payment.DeadLetter{
		EventID: taskID(ctx), EventType: t.Type(), Error: fmt.Sprintf("unknown task type %q", t.Type()),
		Source: payment.SourceWorker, Payload: jsonOrNil(t.Payload()), FallbackID: taskKey(ctx, "unknown_type"),
	})
	w.alerts.Raise("unknown_task_type:"+t.Type(), alert.Warning, "task of unknown type dead-lettered", map[string]any{"type": t.Type(), "sink": out.Sink})
	return fmt.Errorf("unknown task type %q: %w", t.Type(), asynq.SkipRetry)
}

func (w *Worker) maintenance(ctx context.Context, kind string, run func(context.Context) error) error {
	if err := run(ctx); err != nil {
		w.metrics.tasks.WithLabelValues(kind, "error").Inc()
		w.log.Warn().Err(err).Str("task", kind).Msg("maintenance task failed")
		return err
	}
	w.metrics.tasks.WithLabelValues(kind, "done").Inc()
	return nil
}

// gateConcurrency bounds the chain checks of one task run at once.
const gateConcurrency = 8

// Bounds of a last attempt that meets an outage (paymentTask).
const (
	// lastAttemptOutagePause is the wait between its runs.
	lastAttemptOutagePause = time.Second
	// lastAttemptRunsMax bounds its runs, whatever its deadline.
	lastAttemptRunsMax = 30
	// lastAttemptRunLeft is the time its deadline must still leave for
	// another run: a run cut by the task's own timeout spends the budget.
	lastAttemptRunLeft = task.TaskTimeout / 2
)

// paymentTask runs a payment task. asynq archives a task whose last
// attempt returns any error, an outage too (IsFailure only keeps outages
// off the count), so a last attempt that meets nothing but an outage
// waits for the dependency here and runs again, while its deadline leaves
// room for a whole run; past that it returns the outage, asynq archives
// the task, and stale recovery brings its events back. Settled events
// find themselves done on the next run, as on an asynq retry.
func (w *Worker) paymentTask(ctx context.Context, t *asynq.Task) error {
	for run := 1; ; run++ {
		err := w.payment(ctx, t)
		if !outageOnly(err) || !lastAttempt(ctx) || run >= lastAttemptRunsMax || !roomForRun(ctx, lastAttemptOutagePause+lastAttemptRunLeft) {
			return err
		}
		w.log.Warn().Err(err).Str("task_id", taskID(ctx)).Int("run", run).Msg("last attempt met an outage; waiting to run again")
		select {
		case <-ctx.Done():
			return err
		case <-time.After(lastAttemptOutagePause):
		}
	}
}

// outageOnly reports whether a task's error asks for a retry because a
// dependency is down.
func outageOnly(err error) bool {
	return errors.Is(err, payment.ErrUnavailable) && !errors.Is(err, asynq.SkipRetry)
}

// lastAttempt reports whether asynq archives the task on any error.
func lastAttempt(ctx context.Context) bool {
	maxRetry, ok := asynq.GetMaxRetry(ctx)
	if !ok {
		maxRetry = task.RetryMax
	}
	return retryCount(ctx) >= maxRetry
}

// roomForRun reports whether ctx is live and its deadline, if any, is at
// least need away.
func roomForRun(ctx context.Context, need time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	deadline, ok := ctx.Deadline()
	return !ok || time.Until(deadline) >= need
}

// payment applies the events of one task. Each event's fate is its own:
// the settled ones are done, a failed one goes to the DLQ alone, and if
// any still needs a retry the task is retried whole, its settled events
// then finding themselves already done.
func (w *Worker) payment(ctx context.Context, t *asynq.Task) error {
	tasks, events, err := task.DecodePaymentTask(t.Payload())
	if err != nil {
		var first task.PaymentTask
		if len(tasks) > 0 {
			first = tasks[0]
		}
		w.metrics.tasks.WithLabelValues(task.TypePayment, "malformed").Inc()
		out := w.dlq.Record(ctx, payment.DeadLetter{
			EventID: orDefault(first.EventID, taskID(ctx)), EventType: task.TypePayment, Error: err.Error(),
			Source: payment.SourceWorker, TraceID: first.TraceID, Payload: jsonOrNil(t.Payload()),
			FallbackID: taskKey(ctx, "malformed"),
		})
		w.log.Error().Err(err).Str("task_id", taskID(ctx)).Str("sink", out.Sink).Msg("malformed payment task dead-lettered")
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}

	runs := make([]eventRun, len(events))
	for i, e := range events {
		log := w.log.With().Str(logging.FieldTraceID, e.TraceID).Str(logging.FieldEventID, e.ID).Int64(logging.FieldUserID, e.UserID).Logger()
		eventCtx, span := startEventSpan(log.WithContext(ctx), tasks[i].TraceParent, e)
		runs[i] = eventRun{ctx: eventCtx, log: log, event: e, acceptedAt: tasks[i].AcceptedAt, span: span}
	}
	w.checkChain(runs)

	var items []postgres.LedgerItem
	var submitted []*eventRun
	for i := range runs {
		r := &runs[i]
		switch {
		case r.err != nil || r.failed:
		case !r.event.Type.Known():
			r.err = w.fail(r.ctx, r.event, fmt.Errorf("unknown event type %q", r.event.Type), "unknown_event_type")
			r.failed = true
		case r.item == nil:
			w.metrics.tasks.WithLabelValues(task.TypePayment, "chain_decided").Inc()
		default:
			items = append(items, *r.item)
			submitted = append(submitted, r)
		}
	}
	ledgerSpans := startLedgerSpans(submitted)
	waitCtx, cancel := ledgerWait(ctx)
	results, errs := w.batcher.SubmitAll(waitCtx, items)
	cancel()
	for i, r := range submitted {
		if errs[i] != nil {
			r.err = errs[i]
			continue
		}
		r.failed, r.err = w.settled(r, results[i])
	}
	endLedgerSpans(ledgerSpans, results, errs)
	w.forgiveContention(ctx, runs)
	return w.finish(runs)
}

// ledgerWaitMargin is how long before its task's deadline a run stops
// waiting for the ledger, at most (a quarter of what is left when it
// submits, if less).
const ledgerWaitMargin = 5 * time.Second

// ledgerWait bounds a run's wait for the ledger to a little before the
// task's deadline. asynq, once the deadline passes, retries the task
// spending its budget, whatever the run returns, and a last run
// dead-letters: ended first, the wait returns an outage (the Batcher's
// Refuse), which spends none, and the run has time to say so.
func ledgerWait(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline.Add(-min(ledgerWaitMargin, time.Until(deadline)/4)))
}

// startEventSpan starts the span of one event's run in the worker, in the
// event's own trace: under its task's traceparent (the scheduler's
// enqueue span), else a root span in the trace of its trace_id.
func startEventSpan(ctx context.Context, traceparent string, e payment.Event) (context.Context, trace.Span) {
	ctx, span := tracing.Start(tracing.ForEvent(ctx, traceparent, e.TraceID), "payment.process", tracing.Consumer)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("settle.event_id", e.ID), attribute.String("settle.event_type", string(e.Type)),
			attribute.String("settle.task_id", taskID(ctx)), attribute.Int("settle.retry", retryCount(ctx)))
	}
	return ctx, span
}

// startLedgerSpans starts one span per event handed to the ledger, under
// the event's own span: the batch commits many traces' events at once, and
// each trace sees its event's wait and commit (nil when tracing is off).
func startLedgerSpans(submitted []*eventRun) []trace.Span {
	if !tracing.Enabled() {
		return nil
	}
	spans := make([]trace.Span, len(submitted))
	for i, r := range submitted {
		_, spans[i] = tracing.Start(r.ctx, "ledger.commit", tracing.Internal)
		spans[i].SetAttributes(attribute.Int("settle.batch_events", len(submitted)))
	}
	return spans
}

func endLedgerSpans(spans []trace.Span, results []postgres.LedgerResult, errs []error) {
	for i, span := range spans {
		err := errs[i]
		if err == nil {
			span.SetAttributes(attribute.String("settle.result", results[i].Kind.String()),
				attribute.String("settle.outcome", string(results[i].Outcome)))
			err = results[i].Err
			if results[i].Kind == postgres.Applied || results[i].Kind == postgres.AlreadyDone || results[i].Kind == postgres.Stale {
				err = nil // a recorded decision (even dead-lettered), not a failed commit
			}
		}
		tracing.End(span, err)
	}
}

// eventRun is one event of a task on its way through the worker.
type eventRun struct {
	ctx        context.Context
	log        zerolog.Logger
	event      payment.Event
	acceptedAt time.Time
	item       *postgres.LedgerItem // nil once decided without the ledger
	err        error                // set: retry (or, with failed, why it failed)
	failed     bool                 // dead-lettered
	span       trace.Span           // ended by finish
}

// checkChain runs the finality gate over the chain-gated events of a task,
// a few at a time; the others go to the ledger as they are.
func (w *Worker) checkChain(runs []eventRun) {
	slots := make(chan struct{}, gateConcurrency)
	var wg sync.WaitGroup
	for i := range runs {
		r := &runs[i]
		r.item = &postgres.LedgerItem{Event: r.event}
		if w.gate == nil || !r.event.ChainGated() {
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			r.item, r.err = w.gate.Check(r.ctx, *r.item)
		}()
	}
	wg.Wait()
}

// settled reports the ledger's answer for one event: no error when it is
// done, else the error to retry on (or, with failed, the one it failed
// with).
func (w *Worker) settled(r *eventRun, result postgres.LedgerResult) (failed bool, err error) {
	e, log := r.event, r.log
	switch result.Kind {
	case postgres.Applied:
		w.metrics.tasks.WithLabelValues(task.TypePayment, string(result.Outcome)).Inc()
		if !r.acceptedAt.IsZero() {
			path := "trusted"
			if r.item.Chain != nil {
				path = "chain"
			}
			w.metrics.latency.WithLabelValues(path).Observe(time.Since(r.acceptedAt).Seconds())
		}
		event := log.Info()
		if result.Outcome == payment.OutcomeDeadLettered {
			event = log.Error().AnErr("reason", result.Err).Int64("dlq_id", result.DeadLetterID)
		}
		event.Str("outcome", string(result.Outcome)).Str("status", string(result.Status)).
			Str("asset", result.Event.Asset).Str("amount", result.Event.Amount.String()).Msg("event settled")
		if result.Alert != "" {
			w.alerts.Raise("ledger:"+e.ID, alert.Critical, result.Alert, map[string]any{"event_id": e.ID, "trace_id": e.TraceID, "dlq_id": result.DeadLetterID})
		}
		return false, nil
	case postgres.AlreadyDone, postgres.Stale:
		w.metrics.tasks.WithLabelValues(task.TypePayment, result.Kind.String()).Inc()
		log.Debug().Str("result", result.Kind.String()).Str("status", string(result.Status)).Msg("nothing to do")
		if result.Alert != "" {
			w.alerts.Raise("ledger:"+e.ID, alert.Critical, result.Alert, map[string]any{"event_id": e.ID, "trace_id": e.TraceID})
		}
		return false, nil
	case postgres.Rejected:
		// The task names no stored event, or describes it wrongly: it can
		// never apply. The event itself (if any) is untouched; stale
		// recovery re-enqueues it from the database if it needs it.
		w.metrics.tasks.WithLabelValues(task.TypePayment, "rejected").Inc()
		letter := letterFor(e, result.Err, retryCount(r.ctx)+1)
		// The task's retries (for its other events) meet this again.
		letter.FallbackID = "rejected:" + taskID(r.ctx) + ":" + e.ID + ":g" + strconv.Itoa(e.Generation)
		out := w.dlq.Record(r.ctx, letter)
		w.alerts.Raise("rejected_task:"+e.ID, alert.Critical, "payment task rejected by the ledger", map[string]any{"event_id": e.ID, "trace_id": e.TraceID, "reason": result.Err.Error(), "sink": out.Sink})
		return true, result.Err
	case postgres.Retry:
		return false, result.Err
	}
	return false, fmt.Errorf("ledger returned unknown result %d", result.Kind)
}

// finish decides the task from its events' fates. While the task has
// retries left, events that failed transiently are retried (with
// RetryDelay's backoff); past them, or on an error that is not transient,
// an event fails into the DLQ now. An outage (ErrUnavailable) is retried
// without spending the budget (IsFailure), even on the last attempt, and
// so is contention within its window (forgiveContention), so only errors
// of the event's own, like a lock held past the window, exhaust it. The seed's exhaustion branch
// never ran under Celery; this one is exercised by the tests. A task with
// a dead-lettered event is archived in asynq, where operators see it.
func (w *Worker) finish(runs []eventRun) error {
	var retry, failed []error
	for i := range runs {
		r := &runs[i]
		if r.err == nil {
			r.span.End()
			continue
		}
		if !r.failed {
			r.failed, r.err = w.retryOrFail(r.ctx, r.event, r.err)
		}
		if r.failed {
			failed = append(failed, r.err)
		} else {
			retry = append(retry, r.err)
		}
		tracing.End(r.span, r.err)
	}
	switch {
	case len(retry) > 0:
		w.metrics.retries.Inc()
		return errors.Join(retry...)
	case len(failed) > 0:
		return fmt.Errorf("%w: %w", errors.Join(failed...), asynq.SkipRetry)
	}
	return nil
}

// retryOrFail keeps a transient error for a retry while the task has
// retries left, and otherwise fails the event into the DLQ now.
//
// An error of no known kind is internal: it may pass (a bug in a rare
// path, a driver hiccup nobody classified), so it spends the retries like
// a transient one, and then the event reaches the DLQ; only invalid input
// fails at once, since no retry can fix it.
//
// A run whose context was canceled never fails its event: asynq took the
// task back (a graceful stop requeues it) or lost its lease, and the next
// run decides; if asynq archived it instead, stale recovery still finds
// the event 'enqueued'. The task's own timeout (DeadlineExceeded) spends
// the budget like any transient error, but a wait for the ledger ends
// before it, as an outage (ledgerWait).
//
// An outage (ErrUnavailable) is retried whatever the count: it never
// spends the budget, so it cannot exhaust it either (see paymentTask for
// the last attempt). A statement naming a table, column or function the
// database lacks counts as one (the schema is behind, see
// postgres.SchemaMismatch); since a wrong statement looks the same and
// would retry forever, it raises a critical alert while it lasts.
// Contention within RETRY_CONTENTION_WINDOW arrives here as an outage.
func (w *Worker) retryOrFail(ctx context.Context, e payment.Event, err error) (failed bool, _ error) {
	retried := retryCount(ctx)
	handedBack := errors.Is(ctx.Err(), context.Canceled)
	if postgres.SchemaMismatch(err) && !handedBack {
		w.alerts.Raise("schema_mismatch", alert.Critical,
			"payment events wait: the database lacks a table, column or function the worker uses (run `api migrate`; if the schema is current, the statement is wrong)",
			map[string]any{"event_id": e.ID, "trace_id": e.TraceID, "error": err.Error()})
	}
	if handedBack || errors.Is(err, payment.ErrUnavailable) || (!errors.Is(err, payment.ErrInvalid) && !lastAttempt(ctx)) {
		w.metrics.tasks.WithLabelValues(task.TypePayment, "retry").Inc()
		logging.From(ctx).Warn().Err(err).Int("retry", retried+1).Msg("payment event will be retried")
		return false, err
	}
	reason := "unexpected_error"
	if errors.Is(err, payment.ErrRetryable) {
		reason = "retries_exhausted"
		err = fmt.Errorf("retries exhausted after %d attempts: %w", retried+1, err)
	}
	return true, w.fail(ctx, e, err, reason)
}

// fail ends the event failed with a DLQ row (or parks the row in Redis,
// or logs it) and alerts.
func (w *Worker) fail(ctx context.Context, e payment.Event, cause error, reason string) error {
	out := w.dlq.FailEvent(ctx, letterFor(e, cause, retryCount(ctx)+1))
	w.metrics.tasks.WithLabelValues(task.TypePayment, reason).Inc()
	logging.From(ctx).Error().Err(cause).Str("sink", out.Sink).Bool("event_failed", out.Failed).Msg("payment event dead-lettered")
	w.alerts.Raise("dead_letter:"+reason, alert.Critical, "payment event dead-lettered", map[string]any{
		"event_id": e.ID, "trace_id": e.TraceID, "reason": reason, "error": cause.Error(), "sink": out.Sink,
	})
	return cause
}

func letterFor(e payment.Event, cause error, attempt int) payment.DeadLetter {
	return payment.DeadLetter{
		EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
		Error: cause.Error(), Attempt: attempt, Generation: e.Generation, Source: payment.SourceWorker, TraceID: e.TraceID,
	}
}

func retryCount(ctx context.Context) int {
	n, _ := asynq.GetRetryCount(ctx)
	return n
}

func taskID(ctx context.Context) string {
	id, _ := asynq.GetTaskID(ctx)
	return orDefault(id, "unknown")
}

// taskKey is the idempotency key of the one letter a task of this kind
// writes: a run repeated after a commit whose answer was lost (or a
// worker that died before asynq heard of it) writes no second row. Empty
// when the task has no id: the sink then makes up a key of its own.
func taskKey(ctx context.Context, kind string) string {
	id, ok := asynq.GetTaskID(ctx)
	if !ok || id == "" {
		return ""
	}
	return kind + ":" + id
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// jsonOrNil keeps a payload for the DLQ only if it is JSON (the column is
// jsonb); anything else is described in the error instead.
func jsonOrNil(b []byte) []byte {
	if len(b) > 0 && json.Valid(b) {
		return b
	}
	return nil
}

type workerMetrics struct {
	tasks   *prometheus.CounterVec
	retries prometheus.Counter
	latency *prometheus.HistogramVec
}

func newWorkerMetrics(reg prometheus.Registerer) *workerMetrics {
	m := &workerMetrics{
		tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_tasks_total", Help: "Tasks handled, by type and outcome.",
		}, []string{"type", "outcome"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_task_retries_total", Help: "Payment tasks handed back to asynq for a retry.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "settle_event_latency_seconds",
			Help: "From webhook acceptance to the event's terminal status, by path: trusted (settled at once) " +
				"or chain (waited for the finality policy, which takes minutes by design).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"path"}),
	}
	if reg != nil {
		reg.MustRegister(m.tasks, m.retries, m.latency)
	}
	// The series the alerts read exist at 0 from the start: rate() misses
	// what a series held when it first appeared.
	m.tasks.WithLabelValues(task.TypePayment, string(payment.OutcomeSuccess))
	for _, path := range []string{"trusted", "chain"} {
		m.latency.WithLabelValues(path)
	}
	return m
}

// recheck runs a recheck an api handed over. The record is the answer:
// the api waits for it. Without an RPC here (the api hands a recheck
// only to networks a worker reported one on, but this one may be older
// or configured otherwise) nothing is recorded and the api times out.
func (w *Worker) recheck(ctx context.Context, payload []byte) error {
	var r task.RecheckTask
	if err := json.Unmarshal(payload, &r); err != nil || r.EventID == "" {
		w.log.Error().Err(err).Msg("malformed recheck task; dropped")
		return nil
	}
	if w.rechecker == nil {
		w.log.Warn().Str(logging.FieldEventID, r.EventID).Msg("recheck task on a worker without an RPC; dropped")
		return nil
	}
	rec, err := w.rechecker.Recheck(ctx, r.EventID, r.RequestedBy)
	if errors.Is(err, payment.ErrUnavailable) && rec.ID != 0 {
		return nil // recorded as unavailable: the answer
	}
	if err != nil {
		return err
	}
	w.log.Info().Str(logging.FieldEventID, r.EventID).Str("result", string(rec.Result)).Str("chain_state", rec.ChainState).
		Str("requested_by", r.RequestedBy).Msg("deposit rechecked for the api")
	return nil
}
