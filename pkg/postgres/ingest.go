package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/groupcommit"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/tracing"
)

// Ingest group-commit bounds.
const (
	IngestBatchMaxDefault    = 128
	IngestInFlightMaxDefault = 1
	ingestQueueMax           = 8192
	// ingestStatementTimeout bounds one batched insert: past it, every
	// webhook in the batch gets 503 and the provider redelivers.
	ingestStatementTimeout = 5 * time.Second
)

// Ingest commits webhooks' events in groups: each concurrent InsertEvent
// waits while its event rides in the next multi-row insert with whatever
// other events are waiting. One commit (and one fsync, one NOTIFY) then
// serves many webhooks, and nothing is answered before it is durable.
type Ingest struct {
	db      *DB
	engine  *groupcommit.Engine[ingestItem, ingestResponse]
	handoff Handoff
}

// Handoff lets the api hand a commit's events to the queue itself: every
// event otherwise costs a second durable transaction (the scheduler's
// claim, an UPDATE of its row) and, at a trickle, the scheduler's
// wake-ups, only to say 'enqueued' before its task exists.
type Handoff interface {
	// Take is asked before a batch of n events commits. A taskMax above
	// zero has the batch insert its events 'enqueued', in tasks of at most
	// taskMax events, without waking the scheduler; zero leaves them
	// 'pending' for it.
	Take(n int) (taskMax int)
	// Give gets the events so claimed after COMMIT, to enqueue them; an
	// event it cannot enqueue stays 'enqueued' for stale recovery unless
	// Give sends it back (DB.ReleaseHanded).
	Give(claimed []Claimed)
}

// IngestOptions configure an Ingest; zero values are the defaults.
type IngestOptions struct {
	BatchMax, InFlightMax int
	// Handoff, when set, is asked about every batch.
	Handoff Handoff
}

type ingestItem struct {
	event NewEvent
	hash  []byte
	// traceparent is the ingest span's, stored with the row so that the
	// scheduler and the worker continue the trace ("" without one).
	traceparent string
}

type ingestRequest = groupcommit.Call[ingestItem, ingestResponse]

type ingestResponse struct {
	inserted bool
	err      error
	// stored is the content hash of the row now stored under the id (ours
	// if inserted), which decides the fate of folded duplicates.
	stored []byte
}

// NewIngest starts the group-commit loop; Close stops it after the
// batches under way.
func NewIngest(db *DB, batchMax, inFlightMax int) *Ingest {
	return NewIngestWith(db, IngestOptions{BatchMax: batchMax, InFlightMax: inFlightMax})
}

// NewIngestWith is NewIngest with every option.
func NewIngestWith(db *DB, o IngestOptions) *Ingest {
	if o.BatchMax <= 0 {
		o.BatchMax = IngestBatchMaxDefault
	}
	if o.InFlightMax <= 0 {
		o.InFlightMax = IngestInFlightMaxDefault
	}
	g := &Ingest{db: db, handoff: o.Handoff}
	g.engine = groupcommit.Start(context.Background(), groupcommit.Options{
		BatchMax: o.BatchMax, InFlight: o.InFlightMax, QueueMax: ingestQueueMax,
		Refuse: func(stage groupcommit.Stage, err error) error {
			switch {
			case errors.Is(err, groupcommit.ErrStopped):
				return payment.Unavailable("ingest", errors.New("shutting down"))
			case stage == groupcommit.Queued:
				return payment.Unavailable("ingest queue", err)
			}
			// The batch may still commit; the provider's retry then meets
			// a duplicate, which is answered 200. Nothing is lost or doubled.
			return payment.Unavailable("ingest wait", err)
		},
	}, g.run)
	return g
}

// InsertEvent has DB.InsertEvent's contract.
func (g *Ingest) InsertEvent(ctx context.Context, e NewEvent) (inserted bool, err error) {
	if e.Source == "" {
		e.Source = SourcePayments
	}
	ctx, span := startIngestSpan(ctx, e)
	defer func() { endIngestSpan(span, inserted, err) }()
	resp, err := g.engine.Submit(ctx, ingestItem{event: e, hash: e.contentHash(), traceparent: tracing.Traceparent(ctx)})
	if err != nil {
		return false, err
	}
	return resp.inserted, resp.err
}

// Close stops accepting and waits for the batches under way.
func (g *Ingest) Close() { g.engine.Close() }

// run inserts one batch. Requests for the same event id are folded: the
// first rides in the statement, the others get its fate (a duplicate if
// their content matches, a conflict if not). A lead refused for its own
// content (an unknown user or asset) decides nothing for followers with
// other content: they ride again, the first of them leading, until each
// is answered; every round answers at least its leads, so a batch takes
// at most as many rounds as it has requests.
func (g *Ingest) run(batch []*ingestRequest) {
	for len(batch) > 0 {
		batch = g.round(batch)
	}
}

// round inserts the distinct event ids of batch and answers every request
// it can; it returns the followers to try again.
func (g *Ingest) round(batch []*ingestRequest) (again []*ingestRequest) {
	var live []*ingestRequest
	first := map[string]*ingestRequest{}
	followers := map[*ingestRequest][]*ingestRequest{}
	for _, r := range batch {
		if r.Ctx.Err() != nil {
			r.Answer(ingestResponse{err: payment.Unavailable("ingest", r.Ctx.Err())}, nil)
			continue
		}
		if lead, ok := first[r.Item.event.Event.ID]; ok {
			followers[lead] = append(followers[lead], r)
			continue
		}
		first[r.Item.event.Event.ID] = r
		live = append(live, r)
	}
	if len(live) == 0 {
		return nil
	}
	taskMax := 0
	if g.handoff != nil {
		taskMax = min(g.handoff.Take(len(live)), TaskEventsMax)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ingestStatementTimeout)
	defer cancel()
	results, claimed, err := g.db.insertEvents(ctx, live, taskMax)
	// The webhooks are answered first: their events are durable, and the
	// enqueue below is the queue's business.
	defer func() {
		if len(claimed) > 0 {
			g.handoff.Give(claimed)
		}
	}()
	for i, r := range live {
		var resp ingestResponse
		if err != nil {
			resp.err = err
		} else {
			resp = results[i]
		}
		r.Answer(resp, nil)
		for _, f := range followers[r] {
			switch {
			case resp.stored == nil && refusedContent(resp.err) && !bytes.Equal(f.Item.hash, r.Item.hash):
				again = append(again, f) // nothing stored, and its content may pass
			case resp.stored == nil:
				f.Answer(resp, nil) // an outage, or the very same content refused
			case f.Item.event.sameContent(resp.stored, f.Item.hash):
				f.Answer(ingestResponse{inserted: false}, nil)
			default:
				f.Answer(ingestResponse{err: fmt.Errorf("event %s: %w: it was delivered before with other content", f.Item.event.Event.ID, payment.ErrConflict)}, nil)
			}
		}
	}
	return again
}

// refusedContent tells whether an insert was refused for what its event
// says (an unknown user or asset), which says nothing of another
// delivery under the same id.
func refusedContent(err error) bool {
	return errors.Is(err, payment.ErrUnknownUser) || errors.Is(err, payment.ErrUnknownAsset)
}

// insertEvents runs insert_events for distinct event ids, retrying the
// rows that raced a concurrent insert outside the batch. With a taskMax
// above zero the rows it inserts are inserted 'enqueued' under their
// tasks and returned, committed.
func (db *DB) insertEvents(ctx context.Context, batch []*ingestRequest, taskMax int) ([]ingestResponse, []Claimed, error) {
	out := make([]ingestResponse, len(batch))
	pending := make([]int, len(batch))
	for i := range batch {
		pending[i] = i
	}
	stmt := q("insert_events")
	var claimed []Claimed
	for attempt := 0; attempt < insertRaceRetries && len(pending) > 0; attempt++ {
		n := len(pending)
		ids, types, assets, amounts, txs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		users := make([]int64, n)
		hashes := make([][]byte, n)
		traces, sources, tos, related, indexes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		holds, networks, traceparents := make([]string, n), make([]string, n), make([]string, n)
		for k, i := range pending {
			r := batch[i]
			e := r.Item.event.Event
			ids[k], types[k], users[k], assets[k], amounts[k], txs[k] = e.ID, string(e.Type), e.UserID, e.Asset, e.Amount.String(), e.TxHash
			hashes[k], traces[k], sources[k], tos[k], related[k] = r.Item.hash, e.TraceID, string(r.Item.event.Source), r.Item.event.recipient(), r.Item.event.Related
			indexes[k], holds[k], networks[k], traceparents[k] = e.TransferIndex, e.HoldID, e.Network, r.Item.traceparent
		}
		// One round trip: the statement with the hot path's plan settings,
		// in the implicit transaction of the batch's one Sync (no BEGIN
		// or COMMIT statement: two statements fewer per event at a
		// trickle); it commits when Close reports no error.
		b := &pgx.Batch{}
		b.Queue(q("hot_path_plans").text)
		b.Queue(stmt.text, ids, types, users, assets, amounts, txs, hashes, traces, sources, tos, related, indexes, holds, networks, traceparents, taskMax)
		br := db.pool.SendBatch(ctx, b)
		raced, handed, err := readInserted(br, stmt, batch, pending, out)
		if closeErr := br.Close(); err == nil && closeErr != nil {
			err = classify(stmt.name, closeErr)
		}
		if err != nil {
			// Rows an earlier attempt committed and claimed still go to
			// the queue.
			return nil, claimed, err
		}
		claimed = append(claimed, handed...)
		pending = raced
	}
	for _, i := range pending {
		out[i] = ingestResponse{err: payment.Retryable(stmt.name, errors.New("concurrent delivery of the same event kept racing"))}
	}
	return out, claimed, nil
}

// ReleaseHanded sends events the api claimed at ingest, and could not
// enqueue, back to the outbox under a new generation and wakes the
// enqueuer; events no longer 'enqueued' under that task stay as they are.
func (db *DB) ReleaseHanded(ctx context.Context, claimed []Claimed) (released int, err error) {
	for _, group := range groupByTask(claimed) {
		ids := make([]string, len(group))
		for i, c := range group {
			ids[i] = c.Event.ID
		}
		moved, _, err := transition(ctx, db.pool, q("release_handed"), nil, func(rows pgx.Rows) (string, error) {
			var id string
			var woken int64
			err := rows.Scan(&id, &woken)
			return id, err
		}, ids, group[0].TaskID)
		if err != nil {
			return released, err
		}
		released += len(moved)
	}
	return released, nil
}

// groupByTask groups claimed events by task id, in order.
func groupByTask(claimed []Claimed) [][]Claimed {
	var groups [][]Claimed
	index := map[string]int{}
	for _, c := range claimed {
		i, ok := index[c.TaskID]
		if !ok {
			i = len(groups)
			index[c.TaskID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

// readInserted reads insert_events' answer into out, and the rows it
// inserted under a task into claimed, and returns the rows that raced a
// concurrent insert; none of it holds unless the batch's Close then
// reports no error (the commit).
func readInserted(br pgx.BatchResults, stmt query, batch []*ingestRequest, pending []int, out []ingestResponse) (raced []int, claimed []Claimed, err error) {
	if _, err := br.Exec(); err != nil { // hot_path_plans
		return nil, nil, classify(stmt.name, err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	for rows.Next() {
		var pos int64
		var inserted, userExists, assetExists bool
		var existing []byte
		var woken int64
		var h handedRow
		if err := rows.Scan(&pos, &inserted, &existing, &userExists, &assetExists, &woken,
			&h.eventType, &h.userID, &h.asset, &h.amount, &h.txHash, &h.traceID, &h.generation, &h.createdAt, &h.taskID, &h.traceParent); err != nil {
			rows.Close()
			return nil, nil, classify(stmt.name, err)
		}
		i := pending[pos-1]
		e := batch[i].Item.event.Event
		switch {
		case inserted:
			out[i] = ingestResponse{inserted: true, stored: batch[i].Item.hash}
			if h.taskID != nil {
				claimed = append(claimed, h.claimed(e.ID))
			}
		case existing != nil && batch[i].Item.event.sameContent(existing, batch[i].Item.hash):
			out[i] = ingestResponse{stored: existing}
		case existing != nil:
			out[i] = ingestResponse{stored: existing, err: fmt.Errorf("event %s: %w: it was delivered before with other content", e.ID, payment.ErrConflict)}
		case !userExists:
			out[i] = ingestResponse{err: fmt.Errorf("%w %d", payment.ErrUnknownUser, e.UserID)}
		case !assetExists:
			out[i] = ingestResponse{err: fmt.Errorf("%w %q", payment.ErrUnknownAsset, e.Asset)}
		default:
			raced = append(raced, i)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	return raced, claimed, nil
}

// handedRow is the rest of an insert_events row: set only for a row
// inserted under a task, what scanClaimed reads of a claimed one.
type handedRow struct {
	eventType, asset, amount, traceID, taskID *string
	txHash, traceParent                       string
	userID                                    *int64
	generation                                *int32
	createdAt                                 *time.Time
}

func (h handedRow) claimed(id string) Claimed {
	c := Claimed{CreatedAt: *h.createdAt, TaskID: *h.taskID, TraceParent: h.traceParent}
	c.Event.ID, c.Event.Type, c.Event.UserID, c.Event.Asset = id, payment.EventType(*h.eventType), *h.userID, *h.asset
	c.Event.Amount, c.Event.TxHash, c.Event.TraceID, c.Event.Generation = decimal.RequireFromString(*h.amount), h.txHash, *h.traceID, int(*h.generation)
	return c
}

// startIngestSpan starts the span of one event's way into the outbox:
// under the request's span, else (an event settle made itself) a root
// span in the trace of the event's trace_id.
func startIngestSpan(ctx context.Context, e NewEvent) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = tracing.WithTraceID(ctx, e.Event.TraceID)
	}
	ctx, span := tracing.Start(ctx, "ingest.insert", tracing.Internal)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("settle.event_id", e.Event.ID), attribute.String("settle.event_type", string(e.Event.Type)),
			attribute.String("settle.source", string(e.Source)))
	}
	return ctx, span
}

func endIngestSpan(span trace.Span, inserted bool, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Bool("settle.inserted", inserted))
	}
	tracing.End(span, err)
}
