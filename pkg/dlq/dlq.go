// Package dlq writes dead letters so that none is ever lost: PostgreSQL
// first; if PostgreSQL is unavailable, a Redis list whose TTL is set in
// the same MULTI as the push; if Redis fails too, a CRITICAL log line
// carrying the whole entry. Drain moves the Redis entries back into
// PostgreSQL. A letter PostgreSQL refuses for good (a value its columns
// cannot hold) is never parked, since no drain could store it: it is
// stored sanitised (sanitise.go), or else logged critically.
package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/payment"
)

// Redis keys and bounds of the fallback.
const (
	// FallbackKey is the list parked entries wait in.
	FallbackKey = "settle:dlq:fallback"
	// drainingKey holds the entry being drained, so a crash mid-drain
	// loses nothing: the next drain puts it back first.
	drainingKey = "settle:dlq:draining"
	// FallbackTTL is refreshed with every push, in the same MULTI.
	FallbackTTL = 7 * 24 * time.Hour
	// DrainBatchMax bounds one drain run.
	DrainBatchMax = 500
	// DrainFailuresMax consecutive failed inserts abort a drain run.
	DrainFailuresMax = 10
	// writeTimeout bounds each sink attempt, so a dead PostgreSQL still
	// leaves time for Redis and the log.
	writeTimeout = 5 * time.Second
)

// Store is the PostgreSQL side.
type Store interface {
	FailToDLQ(ctx context.Context, letter payment.DeadLetter) (bool, int64, error)
	InsertDeadLetters(ctx context.Context, letters []payment.DeadLetter) ([]int64, error)
}

// Sink is the two-level dead-letter writer.
type Sink struct {
	store  Store
	redis  redis.UniversalClient
	log    zerolog.Logger
	writes *prometheus.CounterVec
	parked prometheus.Gauge
	moved  prometheus.Counter
}

// NewSink builds a sink; reg may be nil.
func NewSink(store Store, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Sink {
	s := &Sink{
		store: store, redis: rdb, log: log,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_dlq_writes_total", Help: "Dead letters written, by sink: postgres, redis (fallback) or log (both failed).",
		}, []string{"sink"}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_dlq_fallback_entries", Help: "Dead letters waiting in the Redis fallback list at the last drain.",
		}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_dlq_drained_total", Help: "Dead letters moved from the Redis fallback into PostgreSQL.",
		}),
	}
	if reg != nil {
		reg.MustRegister(s.writes, s.parked, s.moved)
	}
	// Every sink's series exists at 0 from the start: the DLQ alerts'
	// increase() would miss a process's first letter to a sink.
	for _, sink := range []string{"postgres", "redis", "log"} {
		s.writes.WithLabelValues(sink)
	}
	return s
}

// Outcome says where a dead letter ended up.
type Outcome struct {
	// Sink is "postgres", "redis" or "log".
	Sink string
	// Failed: the event was moved to failed along with the row
	// (postgres sink only; a parked entry fails it when drained).
	Failed bool
	ID     int64
}

// FailEvent fails the live task's event and records why. PostgreSQL down:
// the entry is parked in Redis with FailEvent set; Redis down too: the
// CRITICAL log line is the record. It never returns an error: one of the
// three always takes the entry.
func (s *Sink) FailEvent(ctx context.Context, letter payment.DeadLetter) Outcome {
	if letter.CreatedAt.IsZero() {
		letter.CreatedAt = time.Now().UTC()
	}
	letter.FailEvent = true // read only from a parked entry
	if letter.FallbackID == "" {
		letter.FallbackID = payment.FailureKey(letter.EventID, letter.Generation)
	}
	return s.write(ctx, letter, func(ctx context.Context, l payment.DeadLetter) (Outcome, error) {
		moved, id, err := s.store.FailToDLQ(ctx, l)
		return Outcome{Sink: "postgres", Failed: moved, ID: id}, err
	})
}

// Record writes a dead letter that fails no event (the task named no
// stored event, or its payload could not be read). A letter with a
// FallbackID is written at most once; one without gets a fresh one.
func (s *Sink) Record(ctx context.Context, letter payment.DeadLetter) Outcome {
	if letter.CreatedAt.IsZero() {
		letter.CreatedAt = time.Now().UTC()
	}
	if letter.FallbackID == "" {
		letter.FallbackID = uuid.NewString()
	}
	return s.write(ctx, letter, func(ctx context.Context, l payment.DeadLetter) (Outcome, error) {
		ids, err := s.store.InsertDeadLetters(ctx, []payment.DeadLetter{l})
		out := Outcome{Sink: "postgres"}
		if len(ids) > 0 { // none: an entry with this FallbackID exists
			out.ID = ids[0]
		}
		return out, err
	})
}

// write stores a letter in PostgreSQL through store; sanitised if
// PostgreSQL refuses it for good, parked in Redis if PostgreSQL is
// unavailable, and logged if neither takes it. The letter carries its
// FallbackID from the first attempt: a commit whose answer was lost may
// have stored it, and the parked copy must then drain into nothing.
func (s *Sink) write(ctx context.Context, letter payment.DeadLetter, store func(context.Context, payment.DeadLetter) (Outcome, error)) Outcome {
	attempt := func(l payment.DeadLetter) (Outcome, error) {
		pgCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		return store(pgCtx, l)
	}
	out, err := attempt(letter)
	if err == nil {
		s.writes.WithLabelValues("postgres").Inc()
		return out
	}
	if refused(err) {
		clean := sanitise(letter, err)
		out, cleanErr := attempt(clean)
		switch {
		case cleanErr == nil:
			s.writes.WithLabelValues("postgres").Inc()
			s.log.Warn().Err(err).Str("event_id", clean.EventID).Str("trace_id", clean.TraceID).
				Msg("dead letter stored sanitised: PostgreSQL refused its values")
			return out
		case refused(cleanErr):
			s.lastResort(letter, err, cleanErr)
			return Outcome{Sink: "log"}
		}
		letter, err = clean, cleanErr // the outage came after the refusal
	}
	return s.fallback(ctx, letter, err)
}

// refused tells a permanent refusal by PostgreSQL from a passing failure
// (an outage, a lock or statement timeout, a deadline), which the drain
// retries later: only the latter may wait in Redis. An error of no known
// kind counts as a refusal: an outage must be proven.
func refused(err error) bool {
	return !errors.Is(err, payment.ErrUnavailable) && !errors.Is(err, payment.ErrRetryable) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

func (s *Sink) fallback(ctx context.Context, letter payment.DeadLetter, pgErr error) Outcome {
	if letter.FallbackID == "" {
		letter.FallbackID = uuid.NewString()
	}
	body, err := json.Marshal(letter)
	if err == nil {
		redisCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		err = s.push(redisCtx, body)
		cancel()
		if err == nil {
			s.writes.WithLabelValues("redis").Inc()
			s.log.Warn().Err(pgErr).Str("event_id", letter.EventID).Str("trace_id", letter.TraceID).
				Str("fallback_id", letter.FallbackID).Msg("dead letter parked in Redis: PostgreSQL refused it")
			return Outcome{Sink: "redis"}
		}
	}
	s.writes.WithLabelValues("log").Inc()
	// The last resort: everything needed to recover by hand, on one line.
	s.log.WithLevel(zerolog.ErrorLevel).Str("severity", "CRITICAL").
		Str("event_id", letter.EventID).Str("trace_id", letter.TraceID).
		AnErr("postgres_error", pgErr).AnErr("redis_error", err).
		RawJSON("dead_letter", mustJSON(letter)).
		Msg("dead letter could not be stored in PostgreSQL or Redis")
	return Outcome{Sink: "log"}
}

// lastResort logs a letter PostgreSQL refused both as it was and
// sanitised: everything needed to recover it by hand, on one line.
func (s *Sink) lastResort(letter payment.DeadLetter, refusal, sanitisedErr error) {
	s.writes.WithLabelValues("log").Inc()
	s.log.WithLevel(zerolog.ErrorLevel).Str("severity", "CRITICAL").
		Str("event_id", letter.EventID).Str("trace_id", letter.TraceID).
		AnErr("postgres_error", refusal).AnErr("sanitised_error", sanitisedErr).
		RawJSON("dead_letter", mustJSON(letter)).
		Msg("dead letter refused by PostgreSQL, sanitised too")
}

// push appends to the fallback list and refreshes its TTL atomically: two
// separate commands once left a key without a TTL.
func (s *Sink) push(ctx context.Context, body []byte) error {
	_, err := s.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, FallbackKey, body)
		p.Expire(ctx, FallbackKey, FallbackTTL)
		return nil
	})
	return err
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(fmt.Sprintf("%q", fmt.Sprint(v)))
	}
	return b
}

// DrainReport counts one drain run. Moved includes Sanitised; Logged
// entries PostgreSQL refused even sanitised left the list for the log.
type DrainReport struct {
	Moved, Malformed, Failed int
	Sanitised, Logged        int
	Remaining                int64
	Aborted                  bool
}

// Drain moves up to DrainBatchMax parked entries into PostgreSQL, oldest
// first. Each entry is moved to a draining key before it is inserted and
// removed only after, so a crash at any point loses nothing; an insert
// that fails while PostgreSQL is unavailable goes back to the end of the
// list, and DrainFailuresMax such failures in a row end the run. An entry
// PostgreSQL refuses for good is stored sanitised, or logged critically
// and dropped: it would never drain, and the list's TTL would lose it.
// Malformed entries are logged critically and dropped.
func (s *Sink) Drain(ctx context.Context) (DrainReport, error) {
	var report DrainReport
	// An entry left mid-drain by a crash goes back first.
	for range DrainBatchMax {
		err := s.redis.LMove(ctx, drainingKey, FallbackKey, "RIGHT", "LEFT").Err()
		if errors.Is(err, redis.Nil) {
			break
		}
		if err != nil {
			return report, fmt.Errorf("restore draining entry: %w", err)
		}
	}
	consecutive := 0
	for range DrainBatchMax {
		body, err := s.redis.LMove(ctx, FallbackKey, drainingKey, "LEFT", "RIGHT").Result()
		if errors.Is(err, redis.Nil) {
			break
		}
		if err != nil {
			return report, fmt.Errorf("take parked entry: %w", err)
		}
		var letter payment.DeadLetter
		if err := json.Unmarshal([]byte(body), &letter); err != nil || letter.EventID == "" {
			s.log.WithLevel(zerolog.ErrorLevel).Str("severity", "CRITICAL").Str("entry", body).AnErr("decode_error", err).
				Msg("malformed entry in the Redis DLQ fallback dropped")
			report.Malformed++
			if err := s.redis.LRem(ctx, drainingKey, 1, body).Err(); err != nil {
				return report, fmt.Errorf("drop malformed entry: %w", err)
			}
			continue
		}
		err = s.insert(ctx, letter)
		if err != nil && refused(err) && ctx.Err() == nil {
			err = s.drainRefused(ctx, letter, err, &report)
			if err == nil { // PostgreSQL answered: not a failure in a row
				consecutive = 0
				if err := s.redis.LRem(ctx, drainingKey, 1, body).Err(); err != nil {
					return report, fmt.Errorf("remove refused entry: %w", err)
				}
				continue
			}
		}
		if err != nil {
			report.Failed++
			consecutive++
			s.log.Warn().Err(err).Str("event_id", letter.EventID).Msg("parked dead letter not drained; pushed back")
			if err := s.redis.LMove(ctx, drainingKey, FallbackKey, "RIGHT", "RIGHT").Err(); err != nil {
				return report, fmt.Errorf("push back entry: %w", err)
			}
			if consecutive >= DrainFailuresMax {
				report.Aborted = true
				break
			}
			continue
		}
		consecutive = 0
		report.Moved++
		s.moved.Inc()
		if err := s.redis.LRem(ctx, drainingKey, 1, body).Err(); err != nil {
			return report, fmt.Errorf("remove drained entry: %w", err)
		}
	}
	remaining, err := s.redis.LLen(ctx, FallbackKey).Result()
	if err != nil {
		return report, fmt.Errorf("count parked entries: %w", err)
	}
	report.Remaining = remaining
	s.parked.Set(float64(remaining))
	return report, nil
}

// drainRefused stores sanitised a parked entry PostgreSQL refused, or
// logs it critically if refused again; it returns the error of a
// sanitised insert that failed for a passing reason (the entry stays).
func (s *Sink) drainRefused(ctx context.Context, letter payment.DeadLetter, refusal error, report *DrainReport) error {
	clean := sanitise(letter, refusal)
	err := s.insert(ctx, clean)
	switch {
	case err == nil:
		report.Moved++
		report.Sanitised++
		s.moved.Inc()
		s.log.Warn().Err(refusal).Str("event_id", clean.EventID).Str("trace_id", clean.TraceID).
			Msg("parked dead letter stored sanitised: PostgreSQL refused its values")
		return nil
	case refused(err) && ctx.Err() == nil:
		report.Logged++
		s.lastResort(letter, refusal, err)
		return nil
	}
	return err
}

func (s *Sink) insert(ctx context.Context, letter payment.DeadLetter) error {
	letter.Source = payment.SourceDrain
	if letter.FailEvent {
		moved, _, err := s.store.FailToDLQ(ctx, letter)
		if err != nil || moved {
			return err
		}
		// The event moved on while the entry was parked (recovered, or
		// settled by another task); the failed attempt is still recorded.
	}
	_, err := s.store.InsertDeadLetters(ctx, []payment.DeadLetter{letter})
	return err
}

// Pending is how many entries wait in the fallback list.
func (s *Sink) Pending(ctx context.Context) (int64, error) { return Waiting(ctx, s.redis) }

// Waiting is how many dead letters wait in rdb's fallback list (the one
// being drained included), not yet in PostgreSQL's.
func Waiting(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	n, err := rdb.LLen(ctx, FallbackKey).Result()
	if err != nil {
		return 0, err
	}
	m, err := rdb.LLen(ctx, drainingKey).Result()
	return n + m, err
}
