// Package groupcommit gathers concurrent callers' items into bounded
// batches that commit together. Under light load a batch is one item and
// nothing waits; under load one commit (one fsync, one round trip) serves
// every caller that arrived while the previous batches were committing.
// The webhook ingest and the ledger both run on it.
package groupcommit

import (
	"context"
	"errors"
	"sync"
)

// QueueMaxDefault bounds the calls waiting for a batch.
const QueueMaxDefault = 4096

// ErrStopped: the engine no longer takes calls.
var ErrStopped = errors.New("group commit stopped")

// Stage says where a call gave up: waiting to join a batch, or waiting for
// its batch's answer (which may still commit).
type Stage int

// Stages of a call.
const (
	Queued Stage = iota
	Waiting
)

// Options bound an engine.
type Options struct {
	// BatchMax bounds the items of one batch; InFlight the batches that
	// commit at once (while they do, the next batch gathers). Both at
	// least 1.
	BatchMax int
	InFlight int
	// QueueMax bounds the calls waiting for a batch; zero: QueueMaxDefault.
	QueueMax int
	// Refuse turns a call's ending before its answer (its context's error,
	// or ErrStopped) into the caller's error; nil returns it as it is.
	Refuse func(stage Stage, err error) error
}

// Call is one caller's item in a batch. The commit function answers each
// call exactly once.
type Call[T, R any] struct {
	Item T
	// Ctx is the caller's context: a call whose caller has gone may be
	// answered without being committed.
	Ctx  context.Context
	done chan answer[R]
}

type answer[R any] struct {
	result R
	err    error
}

// Answer gives the call its fate.
func (c *Call[T, R]) Answer(result R, err error) { c.done <- answer[R]{result, err} }

// Engine is a running group commit.
type Engine[T, R any] struct {
	o       Options
	commit  func(batch []*Call[T, R])
	calls   chan *Call[T, R]
	stop    chan struct{}
	stopped sync.Once
	done    chan struct{}
}

// Start runs an engine until ctx ends or Close; commit runs each batch
// (at most InFlight at once, each on one of InFlight long-lived
// goroutines) and must answer every call of it. It must not keep the
// batch's slice: the slice is reused for the next batch.
func Start[T, R any](ctx context.Context, o Options, commit func(batch []*Call[T, R])) *Engine[T, R] {
	o.BatchMax, o.InFlight = max(o.BatchMax, 1), max(o.InFlight, 1)
	if o.QueueMax <= 0 {
		o.QueueMax = QueueMaxDefault
	}
	e := &Engine[T, R]{o: o, commit: commit, calls: make(chan *Call[T, R], o.QueueMax), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			e.halt()
		case <-e.stop:
		}
	}()
	go e.loop()
	return e
}

// Close stops taking calls and waits for the batches under way.
func (e *Engine[T, R]) Close() {
	e.halt()
	<-e.done
}

// Done is closed once the engine has stopped and its batches have ended.
func (e *Engine[T, R]) Done() <-chan struct{} { return e.done }

func (e *Engine[T, R]) halt() { e.stopped.Do(func() { close(e.stop) }) }

// Submit hands one item to the next batch and waits for its fate.
func (e *Engine[T, R]) Submit(ctx context.Context, item T) (R, error) {
	results, errs := e.SubmitAll(ctx, []T{item})
	return results[0], errs[0]
}

// SubmitAll hands items to the coming batches together and waits for each
// one's fate; errs[i] is set where results[i] is not.
func (e *Engine[T, R]) SubmitAll(ctx context.Context, items []T) (results []R, errs []error) {
	results, errs = make([]R, len(items)), make([]error, len(items))
	calls := make([]*Call[T, R], len(items))
	for i, item := range items {
		c := &Call[T, R]{Item: item, Ctx: ctx, done: make(chan answer[R], 1)}
		select {
		case <-e.stop:
			errs[i] = e.refuse(Queued, ErrStopped)
			continue
		default:
		}
		select {
		case e.calls <- c:
			calls[i] = c
		case <-ctx.Done():
			errs[i] = e.refuse(Queued, ctx.Err())
		case <-e.stop:
			errs[i] = e.refuse(Queued, ErrStopped)
		}
	}
	for i, c := range calls {
		if c == nil {
			continue
		}
		select {
		case a := <-c.done:
			results[i], errs[i] = a.result, a.err
		case <-ctx.Done():
			errs[i] = e.refuse(Waiting, ctx.Err())
		case <-e.done:
			// Stopped with the call still queued: nobody will answer.
			select {
			case a := <-c.done:
				results[i], errs[i] = a.result, a.err
			default:
				errs[i] = e.refuse(Waiting, ErrStopped)
			}
		}
	}
	return results, errs
}

func (e *Engine[T, R]) refuse(stage Stage, err error) error {
	if e.o.Refuse == nil {
		return err
	}
	return e.o.Refuse(stage, err)
}

// loop runs InFlight committers and closes done once they have all
// returned.
func (e *Engine[T, R]) loop() {
	var committers sync.WaitGroup
	for range e.o.InFlight {
		committers.Go(e.committer)
	}
	committers.Wait()
	close(e.done)
}

// committer forms a batch and commits it, then the next. Each free
// committer waits for a call, so while every one is busy committing,
// calls pile up and the next batch takes as many as BatchMax at once.
// The committers live as long as the engine: a goroutine per batch would
// grow a fresh stack through pgx's every time, which at a trickle (a
// batch per event) cost the worker a tenth of its CPU in stack copying.
func (e *Engine[T, R]) committer() {
	batch := make([]*Call[T, R], 0, e.o.BatchMax)
	for {
		var first *Call[T, R]
		select {
		case first = <-e.calls:
		case <-e.stop:
			return
		}
		batch = append(batch[:0], first)
	gather:
		for len(batch) < e.o.BatchMax {
			select {
			case c := <-e.calls:
				batch = append(batch, c)
			default:
				break gather
			}
		}
		e.commit(batch)
		clear(batch) // the calls are answered: let them go
	}
}
