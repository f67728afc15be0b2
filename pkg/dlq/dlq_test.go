package dlq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ownPostgres is a server this test may stop and start.
func ownPostgres(t *testing.T) (*devenv.Postgres, string) {
	t.Helper()
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(pg.Close)
	db, err := postgres.Open(ctx, pg.URL("postgres"), postgres.Options{ConnsMax: 4})
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Migrate(ctx)
	require.NoError(t, err)
	return pg, pg.URL("postgres")
}

func enqueuedEvent(t *testing.T, db *postgres.DB) payment.Event {
	t.Helper()
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	e := payment.Event{ID: "e-1", Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("2"), TraceID: "trace-1"}
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: e})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	return claimed[0].Event
}

func letter(e payment.Event, why string) payment.DeadLetter {
	return payment.DeadLetter{EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset, Amount: e.Amount.String(),
		Error: why, Attempt: 6, Generation: e.Generation, Source: payment.SourceWorker, TraceID: e.TraceID}
}

func countRows(t *testing.T, dsn, query string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), query).Scan(&n))
	return n
}

// TestPostgresDownParksInRedisAndDrainMovesBack: PostgreSQL unreachable
// while a task fails; the entry goes to Redis with a TTL, and the drain
// moves it into PostgreSQL (failing the event) once PostgreSQL is back.
func TestPostgresDownParksInRedisAndDrainMovesBack(t *testing.T) {
	ctx := context.Background()
	pg, dsn := ownPostgres(t)
	db, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 4})
	require.NoError(t, err)
	defer db.Close()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	defer rdb.Close()
	sink := dlq.NewSink(db, rdb, zerolog.Nop(), nil)
	e := enqueuedEvent(t, db)

	pg.Stop()
	out := sink.FailEvent(ctx, letter(e, "retries exhausted"))
	require.Equal(t, "redis", out.Sink)
	require.EqualValues(t, 1, rdb.LLen(ctx, dlq.FallbackKey).Val())
	ttl := rdb.TTL(ctx, dlq.FallbackKey).Val()
	require.Greater(t, ttl, dlq.FallbackTTL-time.Minute, "the TTL is set with the push")

	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, report.Moved)
	require.EqualValues(t, 1, report.Remaining, "a failed insert goes back to the list")

	require.NoError(t, pg.Start(ctx))
	report, err = sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, report.Moved)
	require.Zero(t, report.Remaining)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1' AND source='drain' AND fallback_id IS NOT NULL`))
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM payment_events WHERE event_id='e-1' AND status='failed' AND outcome='dead_lettered'`))

	// A drain that ran twice (the entry put back after a crash) inserts once.
	var parked payment.DeadLetter
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, `SELECT fallback_id FROM dead_letter_queue WHERE event_id='e-1'`).Scan(&parked.FallbackID))
	again := letter(e, "retries exhausted")
	again.FallbackID, again.FailEvent = parked.FallbackID, true
	body, _ := json.Marshal(again)
	require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())
	report, err = sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, report.Moved)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1'`))
}

func TestDrainAbortsAfterConsecutiveFailuresAndDropsMalformed(t *testing.T) {
	ctx := context.Background()
	pg, dsn := ownPostgres(t)
	db, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 4})
	require.NoError(t, err)
	defer db.Close()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	defer rdb.Close()
	logs := &syncBuffer{}
	sink := dlq.NewSink(db, rdb, zerolog.New(logs), nil)

	require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, "{not json").Err())
	for i := range 12 {
		body, _ := json.Marshal(payment.DeadLetter{EventID: "x", EventType: "deposit", Error: "e", Source: payment.SourceWorker, FallbackID: string(rune('a' + i))})
		require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())
	}
	pg.Stop()
	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, report.Malformed)
	require.True(t, report.Aborted)
	require.Equal(t, dlq.DrainFailuresMax, report.Failed)
	require.EqualValues(t, 12, report.Remaining, "nothing lost")
	require.Contains(t, logs.String(), "CRITICAL")
	require.Contains(t, logs.String(), "{not json")

	require.NoError(t, pg.Start(ctx))
	report, err = sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 12, report.Moved)
	require.Equal(t, 12, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue`))
}

func TestBothDownLogsTheWholeEntry(t *testing.T) {
	ctx := context.Background()
	pg, dsn := ownPostgres(t)
	db, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 4})
	require.NoError(t, err)
	defer db.Close()
	e := enqueuedEvent(t, db)
	pg.Stop()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond})
	logs := &syncBuffer{}
	sink := dlq.NewSink(db, dead, zerolog.New(logs), nil)
	out := sink.FailEvent(ctx, letter(e, "boom"))
	require.Equal(t, "log", out.Sink)
	line := logs.String()
	require.Contains(t, line, `"severity":"CRITICAL"`)
	require.Contains(t, line, `"event_id":"e-1"`)
	require.Contains(t, line, `"amount":"2"`)
	require.Contains(t, line, `"trace_id":"trace-1"`)
}
