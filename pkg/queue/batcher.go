package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	submitQueueMax = 4096
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
	apply       Applier
	opts        postgres.LedgerOptions
	batchMax    int
	inFlightMax int
	requests    chan *request
	wg          sync.WaitGroup

	sizes     prometheus.Histogram
	durations prometheus.Histogram
}

type request struct {
	item postgres.LedgerItem
	done chan response
}

type response struct {
	result postgres.LedgerResult
	err    error
}

// NewBatcher builds a batcher; Run must be running for Submit to return.
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
		apply: apply, opts: opts, batchMax: batchMax, inFlightMax: inFlightMax,
		requests: make(chan *request, submitQueueMax),
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
	return b
}

// Submit hands one event to the next transaction and waits for its fate.
func (b *Batcher) Submit(ctx context.Context, item postgres.LedgerItem) (postgres.LedgerResult, error) {
	results, errs := b.SubmitAll(ctx, []postgres.LedgerItem{item})
	return results[0], errs[0]
}

// SubmitAll hands a task's events to the coming transactions together and
// waits for each one's fate; errs[i] is set where results[i] is not.
func (b *Batcher) SubmitAll(ctx context.Context, items []postgres.LedgerItem) (results []postgres.LedgerResult, errs []error) {
	results, errs = make([]postgres.LedgerResult, len(items)), make([]error, len(items))
	requests := make([]*request, len(items))
	for i, item := range items {
		r := &request{item: item, done: make(chan response, 1)}
		select {
		case b.requests <- r:
			requests[i] = r
		case <-ctx.Done():
			errs[i] = payment.Retryable("ledger submit", ctx.Err())
		}
	}
	for i, r := range requests {
		if r == nil {
			continue
		}
		select {
		case resp := <-r.done:
			results[i], errs[i] = resp.result, resp.err
		case <-ctx.Done():
			// As in Submit: a retry finds whatever the transaction did.
			errs[i] = payment.Retryable("ledger wait", ctx.Err())
		}
	}
	return results, errs
}

// Run forms batches until ctx ends, then finishes the transactions under
// way. A slot is taken before a batch forms, so while every slot is busy
// committing, requests pile up and the next batch takes them all.
func (b *Batcher) Run(ctx context.Context) {
	slots := make(chan struct{}, b.inFlightMax)
	defer b.wg.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var first *request
		select {
		case first = <-b.requests:
		case <-ctx.Done():
			return
		}
		batch := []*request{first}
	gather:
		for len(batch) < b.batchMax {
			select {
			case r := <-b.requests:
				batch = append(batch, r)
			default:
				break gather
			}
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer func() { <-slots }()
			b.run(batch)
		}()
	}
}

func (b *Batcher) run(batch []*request) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	items := make([]postgres.LedgerItem, len(batch))
	for i, r := range batch {
		items[i] = r.item
	}
	started := time.Now()
	results, err := b.apply.ApplyBatch(ctx, items, b.opts)
	b.durations.Observe(time.Since(started).Seconds())
	b.sizes.Observe(float64(len(batch)))
	if err == nil {
		for i, r := range batch {
			r.done <- response{result: results[i]}
		}
		return
	}
	if errors.Is(err, payment.ErrRetryable) && !errors.Is(err, payment.ErrUnavailable) {
		if groups := byUser(batch); len(groups) > 1 {
			// Most likely a row held elsewhere (lock timeout): it must
			// not hold back the users whose rows are free, whose events
			// would otherwise share its every retry. One transaction per
			// user, so a held user costs one lock timeout.
			for _, group := range groups {
				b.run(group)
			}
			return
		}
	}
	if errors.Is(err, payment.ErrRetryable) || errors.Is(err, payment.ErrUnavailable) || len(batch) == 1 {
		for _, r := range batch {
			r.done <- response{err: err}
		}
		return
	}
	// An unexpected error: isolate the event that causes it by running
	// each one alone, so one poison event cannot fail its neighbours.
	for _, r := range batch {
		results, err := b.apply.ApplyBatch(ctx, []postgres.LedgerItem{r.item}, b.opts)
		if err != nil {
			r.done <- response{err: fmt.Errorf("event %s alone: %w", r.item.Event.ID, err)}
			continue
		}
		r.done <- response{result: results[0]}
	}
}

// byUser splits a batch by user, in order of first appearance.
func byUser(batch []*request) [][]*request {
	var groups [][]*request
	index := make(map[int64]int)
	for _, r := range batch {
		i, ok := index[r.item.Event.UserID]
		if !ok {
			i = len(groups)
			index[r.item.Event.UserID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups
}
