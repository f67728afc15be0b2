package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

// ingestWith starts the api's group commit with the hand-off h on the
// pipeline's database.
func (p *pipeline) ingestWith(h postgres.Handoff) *postgres.Ingest {
	ingest := postgres.NewIngestWith(p.db, postgres.IngestOptions{BatchMax: 64, InFlightMax: 1, Handoff: h})
	p.t.Cleanup(ingest.Close)
	return ingest
}

func (p *pipeline) handoff(rdb redis.UniversalClient, depthMax int) *outbox.Handoff {
	return outbox.NewHandoff(outbox.HandoffOptions{Redis: rdb, Release: p.db, Log: zerolog.Nop(), EventsMax: 8, TaskEvents: 4, DepthMax: depthMax})
}

func deposit(id string, user int64, amount string) postgres.NewEvent {
	return postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: decimal.RequireFromString(amount), TraceID: "t-" + id}}
}

// TestHandoffSettlesATrickleWithoutTheScheduler: with no enqueuer
// running, events that come one at a time are claimed by their own
// ingest commit, enqueued by the api and settled once.
func TestHandoffSettlesATrickleWithoutTheScheduler(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noEnqueuer: true})
	p.user(1, nil)
	ingest := p.ingestWith(p.handoff(p.rdb, 100))
	ctx := context.Background()
	const n = 20
	for i := range n {
		inserted, err := ingest.InsertEvent(ctx, deposit(fmt.Sprintf("h-%d", i), 1, "0.5"))
		require.NoError(t, err)
		require.True(t, inserted)
	}
	p.waitFor("all confirmed", 30*time.Second, p.allTerminal)
	require.Equal(t, n, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed' AND generation = 0 AND retry_count = 0`))
	require.Equal(t, "10", p.balance(1, "ETH"))
	p.requireInvariants()
}

// TestHandoffAndSchedulerShareABurstExactlyOnce: concurrent webhooks make
// commits both small (handed off) and large (left to the scheduler); every
// event is credited once.
func TestHandoffAndSchedulerShareABurstExactlyOnce(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	for u := int64(1); u <= 4; u++ {
		p.user(u, nil)
	}
	counted := &countGive{Handoff: p.handoff(p.rdb, 100)}
	ingest := p.ingestWith(counted)
	const n = 400
	// A few alone first: commits of one event, handed off whatever the
	// burst's commits turn out to be (on a fast machine all of them may be
	// larger than the hand-off's bound).
	for i := range 10 {
		_, err := ingest.InsertEvent(context.Background(), deposit(fmt.Sprintf("b-%d", i), int64(i%4+1), "0.25"))
		require.NoError(t, err)
	}
	insertConcurrently(t, ingest, n, 32, func(i int) postgres.NewEvent {
		return deposit(fmt.Sprintf("b-%d", i%(n/2)), int64(i%4+1), "0.25") // every event delivered twice
	})
	p.enqueuer.Wake()
	p.waitFor("all confirmed", 60*time.Second, p.allTerminal)
	require.Equal(t, n/2, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`))
	require.Equal(t, n/2, p.count(`SELECT count(*) FROM balance_events`))
	handed := counted.n.Load()
	require.Positive(t, handed, "some commits were small enough to hand off")
	require.Less(t, handed, int64(n/2), "some were left to the scheduler")
	p.requireInvariants()
}

// TestDefaultHandoffTakesAFullSpeedBurst: with the default
// INGEST_HANDOFF_MAX the api hands off commits of many events too, cut
// into tasks of TASK_EVENTS_MAX, so a burst settles once with no enqueuer
// running; only a commit above the bound is left 'pending'.
func TestDefaultHandoffTakesAFullSpeedBurst(t *testing.T) {
	require.Equal(t, postgres.TaskEventsMax, outbox.HandoffEventsMaxDefault)
	p := newPipeline(t, pipelineOptions{noEnqueuer: true})
	for u := int64(1); u <= 4; u++ {
		p.user(u, nil)
	}
	h := outbox.NewHandoff(outbox.HandoffOptions{Redis: p.rdb, Release: p.db, Log: zerolog.Nop(), TaskEvents: 4, DepthMax: 1000})
	counted := &countGive{Handoff: h}
	ingest := p.ingestWith(counted)
	const n = 300
	insertConcurrently(t, ingest, n, 64, func(i int) postgres.NewEvent {
		return deposit(fmt.Sprintf("f-%d", i), int64(i%4+1), "0.5")
	})
	p.waitFor("all confirmed", 60*time.Second, p.allTerminal)
	require.EqualValues(t, n, counted.n.Load(), "every commit was handed off:\n%s", p.dump())
	require.Greater(t, p.count(`SELECT count(DISTINCT task_id) FROM payment_events`), n/64, "commits were cut into tasks")
	require.Equal(t, n, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed' AND generation = 0`))
	require.Equal(t, n, p.count(`SELECT count(*) FROM balance_events`))
	p.requireInvariants()

	// The bound: one more event than the default in a commit stays with
	// the scheduler.
	require.Zero(t, h.Take(outbox.HandoffEventsMaxDefault+1))
	require.Equal(t, 4, h.Take(outbox.HandoffEventsMaxDefault))
}

// insertConcurrently ingests n events, inFlight at a time, as concurrent
// webhooks would, and fails the test on the first error.
func insertConcurrently(t *testing.T, ingest *postgres.Ingest, n, inFlight int, event func(i int) postgres.NewEvent) {
	t.Helper()
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	slots := make(chan struct{}, inFlight)
	for i := range n {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if _, err := ingest.InsertEvent(context.Background(), event(i)); err != nil {
				first.CompareAndSwap(nil, &err)
			}
		}()
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		require.NoError(t, *err)
	}
}

// countGive counts the events handed off.
type countGive struct {
	*outbox.Handoff
	n atomic.Int64
}

func (c *countGive) Give(claimed []postgres.Claimed) {
	c.n.Add(int64(len(claimed)))
	c.Handoff.Give(claimed)
}

// dropGive is an api killed between the ingest COMMIT and the enqueue:
// the events are committed 'enqueued' and no task is ever made.
type dropGive struct {
	*outbox.Handoff
	mu      sync.Mutex
	dropped []postgres.Claimed
}

func (d *dropGive) claimed() []postgres.Claimed {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]postgres.Claimed(nil), d.dropped...)
}

func (d *dropGive) Give(claimed []postgres.Claimed) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropped = append(d.dropped, claimed...)
}

// TestHandoffCrashBeforeTheEnqueueIsRecoveredOnce: the events an api
// claimed at ingest and never enqueued wait in 'enqueued' (the scheduler
// does not claim them again), stale recovery sends them back once they are
// past its bound, and they are credited exactly once, even when the dead
// api's task turns up afterwards.
func TestHandoffCrashBeforeTheEnqueueIsRecoveredOnce(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	p.user(1, nil)
	crashed := &dropGive{Handoff: p.handoff(p.rdb, 100)}
	ingest := p.ingestWith(crashed)
	ctx := context.Background()
	for i := range 5 {
		_, err := ingest.InsertEvent(ctx, deposit(fmt.Sprintf("c-%d", i), 1, "1"))
		require.NoError(t, err)
	}
	// Give runs after the webhooks are answered.
	p.waitFor("every commit given", 5*time.Second, func() bool { return len(crashed.claimed()) == 5 })
	p.enqueuer.Wake()
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 5, p.count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued' AND task_id IS NOT NULL`), "nobody else claims them")

	// Younger than the stale bound: recovery leaves them alone.
	require.NoError(t, p.recovery.Run(ctx))
	require.Equal(t, 5, p.count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued' AND generation = 0`))
	time.Sleep(p.recovery.StaleAfter + 100*time.Millisecond)
	require.NoError(t, p.recovery.Run(ctx))
	p.enqueuer.Wake()
	p.waitFor("all confirmed", 30*time.Second, p.allTerminal)
	require.Equal(t, 5, p.count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed' AND generation = 1`), p.dump())

	// The dead api's enqueue after all (a zombie): its tasks are of the
	// old generation and credit nothing.
	crashed.Handoff.Give(crashed.claimed())
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("zombie tasks drained", 30*time.Second, func() bool {
		info, err := inspector.GetQueueInfo(task.QueuePayments)
		return err == nil && info.Pending == 0 && info.Active == 0
	})
	require.Equal(t, 5, p.count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, "5", p.balance(1, "ETH"))
	p.requireInvariants()
}

// failEnqueues makes asynq's scripts fail on a client while plain
// commands (the depth reading) work: Redis half broken.
type failEnqueues struct{}

func (failEnqueues) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failEnqueues) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	// The hand-off pipelines its enqueue with the wake-up.
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
				err := errors.New("injected: redis refuses the script")
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}
func (failEnqueues) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			err := errors.New("injected: redis refuses the script")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestHandoffThatCannotEnqueueLeavesTheEventsToTheScheduler: when the
// enqueue fails after COMMIT, the events go back to 'pending' under a new
// generation at once (not after the stale bound) and the scheduler settles
// them; the hand-off then stays off for a while.
func TestHandoffThatCannotEnqueueLeavesTheEventsToTheScheduler(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	p.user(1, nil)
	broken := p.otherRedis()
	broken.AddHook(failEnqueues{})
	h := p.handoff(broken, 100)
	ingest := p.ingestWith(h)
	ctx := context.Background()
	_, err := ingest.InsertEvent(ctx, deposit("f-1", 1, "1"))
	require.NoError(t, err)
	p.waitFor("f-1 released at once, not after the stale bound", 5*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'f-1' AND generation = 1 AND retry_count = 0`) == 1
	})
	require.Zero(t, h.Take(1), "the hand-off is off after a failure")
	_, err = ingest.InsertEvent(ctx, deposit("f-2", 1, "1"))
	require.NoError(t, err)
	p.waitFor("all confirmed", 30*time.Second, p.allTerminal)
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'f-2' AND generation = 0`), p.dump())
	require.Equal(t, "2", p.balance(1, "ETH"))
	p.requireInvariants()
}

// TestHandoffKeepsToTheQueueDepthBound: with no worker the queue only
// grows; the hand-off stops at QUEUE_DEPTH_MAX tasks and leaves the rest
// 'pending'.
func TestHandoffKeepsToTheQueueDepthBound(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	p.user(1, nil)
	ingest := p.ingestWith(p.handoff(p.rdb, 3))
	ctx := context.Background()
	for i := range 7 {
		_, err := ingest.InsertEvent(ctx, deposit(fmt.Sprintf("d-%d", i), 1, "1"))
		require.NoError(t, err)
	}
	depth, err := p.rdb.LLen(ctx, task.PendingListKey(task.QueuePayments)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 3, depth)
	require.Equal(t, 3, p.count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued'`))
	require.Equal(t, 4, p.count(`SELECT count(*) FROM payment_events WHERE status = 'pending'`))
}

func (p *pipeline) dump() string {
	rows, err := p.sql.Query(context.Background(), `SELECT event_id || ' ' || status || ' g' || generation || ' r' || retry_count || ' ' || COALESCE(task_id, '-') FROM payment_events ORDER BY event_id`)
	require.NoError(p.t, err)
	var out string
	for rows.Next() {
		var line string
		require.NoError(p.t, rows.Scan(&line))
		out += line + "\n"
	}
	return out
}

// roundTrips records the commands of every round trip a client makes,
// each named by kind (its name when nil; "" leaves it out, and a trip
// with nothing left is not recorded).
type roundTrips struct {
	mu    sync.Mutex
	trips [][]string
	kind  func(redis.Cmder) string
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.record(cmds)
		return next(ctx, cmds)
	}
}

func (r *roundTrips) record(cmds []redis.Cmder) {
	var names []string
	for _, c := range cmds {
		name := c.Name()
		if r.kind != nil {
			name = r.kind(c)
		}
		if name != "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	r.mu.Lock()
	r.trips = append(r.trips, names)
	r.mu.Unlock()
}

func (r *roundTrips) snapshot() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.trips...)
}

func (r *roundTrips) with(name string) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]string
	for _, trip := range r.trips {
		for _, n := range trip {
			if n == name {
				out = append(out, trip)
				break
			}
		}
	}
	return out
}

// TestHandoffWakesTheWorkersInTheEnqueuesRoundTrip: the api's enqueue of
// a lone event's task carries the workers' wake-up, announcing one task,
// and the trim that bounds their list, in the same round trip; there is
// no wake-up of its own after it.
func TestHandoffWakesTheWorkersInTheEnqueuesRoundTrip(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noEnqueuer: true})
	p.user(1, nil)
	ctx := context.Background()

	client := p.otherRedis()
	ingest := p.ingestWith(p.handoff(client, 100))
	// A first event loads asynq's enqueue script into Redis, so the
	// counted ones never take the NOSCRIPT fallback (EVAL, and the
	// wake-up sent again with it) whatever ran before this test.
	_, err := ingest.InsertEvent(ctx, deposit("pw-warm", 1, "1"))
	require.NoError(t, err)
	p.waitFor("warm-up confirmed", 30*time.Second, p.allTerminal)
	trips := &roundTrips{kind: func(c redis.Cmder) string {
		if c.Name() == "rpush" {
			return strings.TrimSpace(fmt.Sprintln(c.Args()...))
		}
		return c.Name()
	}}
	client.AddHook(trips)
	const n = 3
	for i := range n {
		inserted, err := ingest.InsertEvent(ctx, deposit(fmt.Sprintf("pw-%d", i), 1, "1"))
		require.NoError(t, err)
		require.True(t, inserted)
	}
	p.waitFor("all confirmed", 30*time.Second, p.allTerminal)
	require.Equal(t, "4", p.balance(1, "ETH"))

	wake := "rpush " + task.WakeList + " 1"
	enqueues := trips.with("evalsha")
	require.Len(t, enqueues, n, "one enqueue per event: %v", trips.trips)
	for _, trip := range enqueues {
		require.Equal(t, []string{"evalsha", wake, "ltrim"}, trip, "the enqueue and its wake-up in one round trip")
	}
	require.Len(t, trips.with(wake), n, "no wake-up of its own: %v", trips.trips)
	p.requireInvariants()
}
