package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/settle/settle/pkg/groupcommit"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Group-commit bounds.
const (
	// BatchMaxDefault bounds the events in one ledger transaction.
	BatchMaxDefault = 64
	// InFlightMaxDefault is how many ledger transactions one worker
	// process runs at once; while they commit, the next batch gathers.
	InFlightMaxDefault = 1
	// batchTimeout bounds one transaction including its retries inside
	// the ledger (its statements are bounded by statement_timeout too).
	batchTimeout = 30 * time.Second
	// submitQueueMax bounds requests waiting for a batch.
	submitQueueMax = groupcommit.QueueMaxDefault
)

// Applier is the ledger.
type Applier interface {
	ApplyBatch(ctx context.Context, items []postgres.LedgerItem, opts postgres.LedgerOptions) ([]postgres.LedgerResult, error)
}

// Batcher turns the worker's concurrent tasks into group commits: every
// task blocks in Submit while its event rides in the next transaction with
// whatever other tasks are waiting. Under light load a batch is one event
// and nothing waits; under heavy load one commit carries many events.
type Batcher struct {
	apply   Applier
	opts    postgres.LedgerOptions
	timeout time.Duration // batchTimeout; shorter in tests
	engine  *groupcommit.Engine[postgres.LedgerItem, postgres.LedgerResult]

	sizes     prometheus.Histogram
	durations prometheus.Histogram
}

type request = groupcommit.Call[postgres.LedgerItem, postgres.LedgerResult]

// NewBatcher builds a batcher, taking events at once; Run ends it.
func NewBatcher(apply Applier, opts postgres.LedgerOptions, batchMax, inFlightMax int, reg prometheus.Registerer) *Batcher {
	if batchMax <= 0 {
		batchMax = BatchMaxDefault
	}
	if batchMax > postgres.LedgerBatchMax {
		batchMax = postgres.LedgerBatchMax
	}
	if inFlightMax <= 0 {
		inFlightMax = InFlightMaxDefault
	}
	b := &Batcher{
		apply: apply, opts: opts, timeout: batchTimeout,
		sizes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "settle_ledger_batch_events", Help: "Events per ledger transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		durations: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "settle_ledger_batch_seconds", Help: "Duration of one ledger transaction, commit included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	if reg != nil {
		reg.MustRegister(b.sizes, b.durations)
	}
	b.engine = groupcommit.Start(context.Background(), groupcommit.Options{
		BatchMax: batchMax, InFlight: inFlightMax, QueueMax: submitQueueMax,
		// A retry finds whatever the transaction did. A wait cut by the
		// task's deadline is the ledger not answering (batches ahead stuck
		// behind a table lock, PostgreSQL silent), no fault of the event:
		// an outage, as the batch's own timeout is.
		Refuse: func(stage groupcommit.Stage, err error) error {
			op := "ledger wait"
			if stage == groupcommit.Queued {
				op = "ledger submit"
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return payment.Unavailable(op, err)
			}
			return payment.Retryable(op, err)
		},
	}, b.run)
	return b
}

// Submit hands one event to the next transaction and waits for its fate.
func (b *Batcher) Submit(ctx context.Context, item postgres.LedgerItem) (postgres.LedgerResult, error) {
	return b.engine.Submit(ctx, item)
}

// SubmitAll hands a task's events to the coming transactions together and
// waits for each one's fate; errs[i] is set where results[i] is not.
func (b *Batcher) SubmitAll(ctx context.Context, items []postgres.LedgerItem) (results []postgres.LedgerResult, errs []error) {
	return b.engine.SubmitAll(ctx, items)
}

// Run returns once ctx ends and the transactions under way have.
func (b *Batcher) Run(ctx context.Context) {
	<-ctx.Done()
	b.engine.Close()
}

// run is the engine's commit: every call is answered, so how the batch
// ended is no one else's business here.
func (b *Batcher) run(batch []*request) { _ = b.commit(batch) }

// commit applies a batch, answers every call of it, and returns how the
// batch's transaction ended (nil: committed).
func (b *Batcher) commit(batch []*request) error {
	// A caller that stopped waiting (its task's ledger wait ran out while
	// batches ahead were stuck) has retried as an outage: its call is not
	// committed, nor its copies piling up behind a long lock.
	if gone := slices.IndexFunc(batch, func(r *request) bool { return r.Ctx.Err() != nil }); gone >= 0 {
		live := slices.Clone(batch[:gone])
		for _, r := range batch[gone:] {
			if err := r.Ctx.Err(); err != nil {
				r.Answer(postgres.LedgerResult{}, payment.Unavailable("ledger wait", err))
				continue
			}
			live = append(live, r)
		}
		if len(live) == 0 {
			return nil
		}
		batch = live
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	items := make([]postgres.LedgerItem, len(batch))
	for i, r := range batch {
		items[i] = r.Item
	}
	started := time.Now()
	results, err := b.apply.ApplyBatch(ctx, items, b.opts)
	b.durations.Observe(time.Since(started).Seconds())
	b.sizes.Observe(float64(len(batch)))
	if err == nil {
		for i, r := range batch {
			r.Answer(results[i], nil)
		}
		return nil
	}
	if errors.Is(err, payment.ErrRetryable) && !errors.Is(err, payment.ErrUnavailable) {
		if groups := byUser(batch); len(groups) > 1 {
			// Most likely a row held elsewhere (lock timeout): it must
			// not hold back the users whose rows are free, whose events
			// would otherwise share its every retry. One transaction per
			// user, so a held user costs one lock timeout. A group that
			// meets an outage (the ledger stopped answering: statements
			// prepared again wait on a table lock without a lock timeout,
			// for the batch's whole bound) ends the rest with it, which
			// would each wait as long.
			for i, group := range groups {
				if err := b.commit(group); errors.Is(err, payment.ErrUnavailable) {
					for _, rest := range groups[i+1:] {
						answerAll(rest, err)
					}
					break
				}
			}
			return err
		}
	}
	if errors.Is(err, payment.ErrRetryable) || errors.Is(err, payment.ErrUnavailable) || len(batch) == 1 {
		answerAll(batch, err)
		return err
	}
	// An unexpected error: isolate the event that causes it by running
	// each one alone, so one poison event cannot fail its neighbours.
	for _, r := range batch {
		results, err := b.apply.ApplyBatch(ctx, []postgres.LedgerItem{r.Item}, b.opts)
		if err != nil {
			r.Answer(postgres.LedgerResult{}, fmt.Errorf("event %s alone: %w", r.Item.Event.ID, err))
			continue
		}
		r.Answer(results[0], nil)
	}
	return err
}

func answerAll(batch []*request, err error) {
	for _, r := range batch {
		r.Answer(postgres.LedgerResult{}, err)
	}
}

// byUser splits a batch by user, in order of first appearance.
func byUser(batch []*request) [][]*request {
	var groups [][]*request
	index := make(map[int64]int)
	for _, r := range batch {
		i, ok := index[r.Item.Event.UserID]
		if !ok {
			i = len(groups)
			index[r.Item.Event.UserID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups
}
