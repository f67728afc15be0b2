package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
)

// Hand-off bounds.
const (
	// HandoffEventsMaxDefault is the largest group commit whose events
	// the api hands to the queue itself: every commit of up to 256 events,
	// full speed's too. Measured against 8 (a trickle only), full speed
	// went about 3,500 -> 4,100 applied deposits/s and 0.45 -> 0.37
	// CPU-ms/event: the scheduler's claim was an UPDATE of every row (no
	// HOT update here) and a second durable transaction per event, and
	// tasks cut from a commit run as well as the claim's full ones.
	// Larger commits (a webhook carrying hundreds of events) go to the
	// scheduler.
	HandoffEventsMaxDefault = 256
	// handoffDepthFresh is how old the queue depth the hand-off goes by
	// may be; between readings it counts its own tasks on top.
	handoffDepthFresh = time.Second
	// handoffCooldown is how long the hand-off stays off after Redis
	// failed it; the scheduler's enqueuer probes Redis meanwhile.
	handoffCooldown = 5 * time.Second
	// depthTimeout bounds the depth reading, which a webhook's commit
	// waits for.
	depthTimeout = 250 * time.Millisecond
)

// Releaser sends claimed events the hand-off could not enqueue back to
// the outbox.
type Releaser interface {
	ReleaseHanded(ctx context.Context, claimed []postgres.Claimed) (int, error)
}

// HandoffOptions configure a Handoff.
type HandoffOptions struct {
	Redis   redis.UniversalClient
	Release Releaser
	Log     zerolog.Logger
	// EventsMax is the largest commit handed off; TaskEvents and DepthMax
	// are the scheduler's TASK_EVENTS_MAX and QUEUE_DEPTH_MAX.
	EventsMax  int
	TaskEvents int
	DepthMax   int
	Registerer prometheus.Registerer
}

// Handoff is the api's side of the outbox (postgres.Handoff): an ingest
// commit of at most EventsMax events claims its own events and the api
// enqueues them right after COMMIT, so an event costs one durable
// transaction before the ledger's instead of two, and no scheduler
// wake-up. Whenever Redis is failing, the queue is at QUEUE_DEPTH_MAX, or
// the commit is larger than EventsMax, the events stay 'pending' for the
// scheduler exactly as without it. An api killed between COMMIT and the
// enqueue leaves 'enqueued' events without a task, which stale recovery
// finds after STALE_ENQUEUED_AFTER, like any task the queue lost.
type Handoff struct {
	o        HandoffOptions
	enqueuer *Enqueuer

	mu sync.Mutex
	// depth is the last reading of the payments queue's length plus the
	// tasks handed since: never below the truth but for other producers.
	depth    int
	readAt   time.Time
	offUntil time.Time

	events *prometheus.CounterVec
}

// NewHandoff builds the hand-off; EventsMax <= 0 is HandoffEventsMaxDefault.
func NewHandoff(o HandoffOptions) *Handoff {
	if o.EventsMax <= 0 {
		o.EventsMax = HandoffEventsMaxDefault
	}
	if o.TaskEvents <= 0 {
		o.TaskEvents = TaskEventsDefault
	}
	if o.DepthMax <= 0 {
		o.DepthMax = QueueDepthMaxDefault
	}
	h := &Handoff{
		o:        o,
		enqueuer: NewEnqueuer(EnqueuerOptions{Client: asynq.NewClientFromRedisClient(wakeWithEnqueue{o.Redis}), Redis: o.Redis, Log: o.Log, TaskEvents: o.TaskEvents, DepthMax: o.DepthMax}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_ingest_handoff_events_total",
			Help: "Events of ingest commits by what became of them: handed (the api enqueued them), released (enqueue failed; back to the scheduler).",
		}, []string{"result"}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(h.events)
	}
	return h
}

// Take answers postgres.Handoff: the task size when a commit of n events
// is handed off, else zero.
func (h *Handoff) Take(n int) int {
	if n > h.o.EventsMax {
		return 0
	}
	tasks := (n + h.o.TaskEvents - 1) / h.o.TaskEvents
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if now.Before(h.offUntil) {
		return 0
	}
	if now.Sub(h.readAt) > handoffDepthFresh || h.depth+tasks > h.o.DepthMax {
		ctx, cancel := context.WithTimeout(context.Background(), depthTimeout)
		depth, err := h.o.Redis.LLen(ctx, task.PendingListKey(task.QueuePayments)).Result()
		cancel()
		if err != nil {
			h.offUntil = now.Add(handoffCooldown)
			h.o.Log.Warn().Err(err).Msg("queue depth unreadable; ingest leaves events to the scheduler for a while")
			return 0
		}
		h.depth, h.readAt = int(depth), now
	}
	if h.depth+tasks > h.o.DepthMax {
		return 0
	}
	h.depth += tasks
	return h.o.TaskEvents
}

// Give answers postgres.Handoff: it enqueues what the ingest commit
// claimed and wakes the workers; a task it cannot enqueue goes back to
// the scheduler (or, should that fail too, to stale recovery).
func (h *Handoff) Give(claimed []postgres.Claimed) {
	ctx, cancel := context.WithTimeout(context.Background(), enqueueTimeout)
	defer cancel()
	// The claim ran in the ingest transaction, which began at created_at.
	_, failed := h.enqueuer.enqueueAll(ctx, claimed, claimWindow{start: claimed[0].CreatedAt, end: time.Now()})
	// Each enqueue carried its own wake-up (wakeWithEnqueue).
	if len(failed) < len(claimed) {
		h.events.WithLabelValues("handed").Add(float64(len(claimed) - len(failed)))
	}
	if len(failed) == 0 {
		return
	}
	h.mu.Lock()
	h.offUntil = time.Now().Add(handoffCooldown)
	h.mu.Unlock()
	released, err := h.o.Release.ReleaseHanded(ctx, failed)
	h.events.WithLabelValues("released").Add(float64(released))
	if err != nil {
		h.o.Log.Warn().Err(err).Int("events", len(failed)).Msg("events not enqueued nor released; stale recovery brings them back")
	}
}
