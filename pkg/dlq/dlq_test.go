package dlq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// TestRefusedLetterIsStoredSanitisedNotParked: a letter PostgreSQL
// refuses for good (an amount beyond NUMERIC(38,18), which a task
// describing its event wrongly can carry into a Rejected letter) must not
// be parked in Redis, where every drain would fail on it and push it back
// until the list's TTL dropped it: it is stored at once, sanitised.
func TestRefusedLetterIsStoredSanitisedNotParked(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	sink := dlq.NewSink(db, rdb, zerolog.New(io.Discard), nil)

	out := sink.Record(ctx, payment.DeadLetter{
		EventID: "rejected-1", EventType: "deposit", UserID: 1, Asset: "ETH",
		Amount: "100000000000000000000000000000000000000000", // the task's, not the stored event's
		Error:  "task describes the event wrongly", Attempt: 1, Source: payment.SourceWorker,
		FallbackID: "rejected:task:rejected-1:g0",
	})
	for range 3 { // three minutes of drain_dlq
		report, err := sink.Drain(ctx)
		require.NoError(t, err)
		t.Logf("drain: %+v", report)
	}
	pending, err := sink.Pending(ctx)
	require.NoError(t, err)
	stored := countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id = 'rejected-1'`)
	require.Equal(t, 1, stored, "first sink %s; after three drains %d letter(s) still parked in Redis, none in PostgreSQL", out.Sink, pending)
	require.Equal(t, "postgres", out.Sink)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id = 'rejected-1' AND amount IS NULL
		AND error LIKE 'task describes the event wrongly; stored sanitised%raw amount "100000000000000000000000000000000000000000"'`))

	// An event failed with a payload jsonb refuses: failed, its row stored.
	e := enqueuedEvent(t, db)
	bad := letter(e, "boom")
	bad.Payload = json.RawMessage(`{"memo":"\u0000"}`)
	out = sink.FailEvent(ctx, bad)
	require.Equal(t, "postgres", out.Sink)
	require.True(t, out.Failed)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id = 'e-1' AND payload IS NULL AND amount = 2 AND error LIKE '%raw payload%'`))
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM payment_events WHERE event_id = 'e-1' AND status = 'failed'`))
}

// TestDrainStoresRefusedEntriesSanitised: entries parked before PostgreSQL
// refused them for good are stored sanitised by the drain, and more of
// them than DrainFailuresMax at the head of the list do not hold back the
// good entry behind them.
func TestDrainStoresRefusedEntriesSanitised(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	sink := dlq.NewSink(db, rdb, zerolog.New(io.Discard), nil)
	for i := range dlq.DrainFailuresMax + 1 {
		body, _ := json.Marshal(payment.DeadLetter{EventID: fmt.Sprintf("bad-%d", i), EventType: "deposit", Amount: "1e30",
			Error: "e", Source: payment.SourceWorker, FallbackID: fmt.Sprintf("bad-%d", i)})
		require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())
	}
	body, _ := json.Marshal(payment.DeadLetter{EventID: "good", EventType: "deposit", Amount: "1.5", Error: "e", Source: payment.SourceWorker, FallbackID: "good"})
	require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())

	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, dlq.DrainReport{Moved: dlq.DrainFailuresMax + 2, Sanitised: dlq.DrainFailuresMax + 1}, report)
	require.Equal(t, dlq.DrainFailuresMax+1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id LIKE 'bad-%' AND amount IS NULL AND error LIKE '%raw amount "1e30"'`))
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id = 'good' AND amount = 1.5`))
}

// scriptedStore answers each write with the next scripted error (rest
// once the script is spent) and can run a hook first.
type scriptedStore struct {
	mu      sync.Mutex
	answers []error
	rest    error
	before  func()
	letters []payment.DeadLetter
}

func (s *scriptedStore) next(l payment.DeadLetter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.before != nil {
		s.before()
	}
	s.letters = append(s.letters, l)
	if len(s.answers) == 0 {
		return s.rest
	}
	err := s.answers[0]
	s.answers = s.answers[1:]
	return err
}

func (s *scriptedStore) FailToDLQ(_ context.Context, l payment.DeadLetter) (bool, int64, error) {
	if err := s.next(l); err != nil {
		return false, 0, err
	}
	return true, 1, nil
}

func (s *scriptedStore) InsertDeadLetters(_ context.Context, ls []payment.DeadLetter) ([]int64, error) {
	if err := s.next(ls[0]); err != nil {
		return nil, err
	}
	return []int64{1}, nil
}

var (
	errRefusal = errors.New("insert_dlq: numeric field overflow (SQLSTATE 22003)")
	errOutage  = payment.Unavailable("insert_dlq", errors.New("connection refused"))
)

// TestRefusedTwiceIsLoggedNotParked: a letter PostgreSQL refuses even
// sanitised is logged critically, whole, and never parked.
func TestRefusedTwiceIsLoggedNotParked(t *testing.T) {
	ctx := context.Background()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	logs := &syncBuffer{}
	sink := dlq.NewSink(&scriptedStore{answers: []error{errRefusal, errRefusal}}, rdb, zerolog.New(logs), nil)

	out := sink.Record(ctx, payment.DeadLetter{EventID: "r-1", EventType: "deposit", Amount: "1e30", Error: "e", Source: payment.SourceWorker})
	require.Equal(t, "log", out.Sink)
	require.Contains(t, logs.String(), `"severity":"CRITICAL"`)
	require.Contains(t, logs.String(), `"amount":"1e30"`)
	pending, err := sink.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, pending)
}

// TestRefusedThenUnavailableParksTheSanitisedLetter: PostgreSQL refuses
// the letter, then goes away before the sanitised one: the sanitised
// letter waits in Redis, where the drain can store it.
func TestRefusedThenUnavailableParksTheSanitisedLetter(t *testing.T) {
	ctx := context.Background()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	store := &scriptedStore{answers: []error{errRefusal, errOutage}}
	sink := dlq.NewSink(store, rdb, zerolog.New(io.Discard), nil)

	out := sink.FailEvent(ctx, payment.DeadLetter{EventID: "r-2", EventType: "deposit", Amount: "1e30", Error: "e", Source: payment.SourceWorker})
	require.Equal(t, "redis", out.Sink)
	var parked payment.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(rdb.LIndex(ctx, dlq.FallbackKey, 0).Val()), &parked))
	require.Empty(t, parked.Amount)
	require.True(t, parked.FailEvent)
	require.Contains(t, parked.Error, `raw amount "1e30"`)

	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, report.Moved)
	require.Zero(t, report.Sanitised, "stored as parked, already sanitised")
}

// TestDrainOfARefusedEntry: the drain logs and drops an entry PostgreSQL
// refuses even sanitised (without counting it towards DrainFailuresMax),
// keeps one whose sanitised insert met an outage, and never takes a
// cancelled run for a refusal.
func TestDrainOfARefusedEntry(t *testing.T) {
	ctx := context.Background()
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	park := func() {
		t.Helper()
		body, _ := json.Marshal(payment.DeadLetter{EventID: "p-1", EventType: "deposit", Amount: "1e30", Error: "e", Source: payment.SourceWorker, FallbackID: "p-1"})
		require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())
	}

	park()
	logs := &syncBuffer{}
	sink := dlq.NewSink(&scriptedStore{answers: []error{errRefusal}, rest: errOutage}, rdb, zerolog.New(logs), nil)
	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, dlq.DrainReport{Failed: dlq.DrainFailuresMax, Remaining: 1, Aborted: true}, report, "an outage after the refusal keeps the entry")

	sink = dlq.NewSink(&scriptedStore{answers: []error{errRefusal, errRefusal}}, rdb, zerolog.New(logs), nil)
	report, err = sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, dlq.DrainReport{Logged: 1}, report)
	require.Contains(t, logs.String(), `"severity":"CRITICAL"`)
	require.Contains(t, logs.String(), `"event_id":"p-1"`)

	park()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Whatever the driver makes of it, a refusal seen once the run is
	// cancelled is not trusted.
	store := &scriptedStore{answers: []error{errRefusal}, before: cancel}
	_, err = dlq.NewSink(store, rdb, zerolog.New(io.Discard), nil).Drain(runCtx)
	require.Error(t, err, "the push back meets the cancelled context")
	require.Len(t, store.letters, 1, "no sanitised insert for a cancelled run")
	pending, err := sink.Pending(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pending, "the entry waits for the next run")
}

// ambiguousSink is a sink whose PostgreSQL pool goes through a proxy that
// can drop a connection once the server has answered a command.
func ambiguousSink(t *testing.T) (*dlq.Sink, *testenv.CutProxy, *postgres.DB, redis.UniversalClient, string) {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	proxy, viaProxy := testenv.NewCutProxy(t, dsn)
	db := testenv.OpenDB(t, viaProxy)
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	return dlq.NewSink(db, rdb, zerolog.Nop(), nil), proxy, db, rdb, dsn
}

// TestAmbiguousFailCommitWritesOneRow: the COMMIT that fails the event
// and writes its row is made, but its answer is lost; the sink parks the
// letter in Redis, and its drain must not write the row a second time.
// Replay then reopens the event once.
func TestAmbiguousFailCommitWritesOneRow(t *testing.T) {
	ctx := context.Background()
	sink, proxy, db, rdb, dsn := ambiguousSink(t)
	e := enqueuedEvent(t, db)
	rows := `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1'`

	proxy.Arm("COMMIT")
	out := sink.FailEvent(ctx, letter(e, "retries exhausted"))
	require.Equal(t, 1, proxy.Cuts())
	require.Equal(t, "redis", out.Sink, "a lost answer to COMMIT is an outage to the sink")
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM payment_events WHERE event_id='e-1' AND status='failed' AND outcome='dead_lettered'`), "the commit was made")
	require.Equal(t, 1, countRows(t, dsn, rows))

	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, report.Remaining)
	require.Zero(t, rdb.LLen(ctx, dlq.FallbackKey).Val())
	require.Equal(t, 1, countRows(t, dsn, rows), "one row for one failure")

	// The same failure written again (a worker that died after the commit
	// and ran again) writes nothing either.
	out = sink.FailEvent(ctx, letter(e, "retries exhausted"))
	require.Equal(t, "postgres", out.Sink)
	require.False(t, out.Failed)
	require.Equal(t, 1, countRows(t, dsn, rows))

	views, err := db.DeadLetters(ctx, "open", 0, 10)
	require.NoError(t, err)
	require.Len(t, views, 1)
	result, err := db.ReplayDeadLetter(ctx, views[0].ID, "ops", "fixed")
	require.NoError(t, err)
	require.Equal(t, postgres.Reopened, result)
	result, err = db.ReplayDeadLetter(ctx, views[0].ID, "ops", "fixed")
	require.NoError(t, err)
	require.Equal(t, postgres.AlreadyReplayed, result)

	// The next generation's failure is a row of its own.
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, e.Generation+1, claimed[0].Event.Generation)
	out = sink.FailEvent(ctx, letter(claimed[0].Event, "again"))
	require.True(t, out.Failed)
	require.NotZero(t, out.ID)
	require.Equal(t, 2, countRows(t, dsn, rows))
}

// TestAmbiguousRecordWritesOneRow: the same for a letter that fails no
// event (its INSERT commits alone, and its answer is lost).
func TestAmbiguousRecordWritesOneRow(t *testing.T) {
	ctx := context.Background()
	sink, proxy, _, _, dsn := ambiguousSink(t)

	proxy.Arm("INSERT 0 1")
	out := sink.Record(ctx, payment.DeadLetter{EventID: "task-9", EventType: "nope", Error: "unknown task type", Source: payment.SourceWorker})
	require.Equal(t, 1, proxy.Cuts())
	require.Equal(t, "redis", out.Sink)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='task-9'`), "the insert was made")

	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, report.Remaining)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='task-9'`), "one row for one letter")
}

// TestAmbiguousDrainWritesOneRow: a drain whose COMMIT (failing the event
// with its row) is made but unanswered puts the entry back, like a drain
// that died before LREM; the next drain writes no second row.
func TestAmbiguousDrainWritesOneRow(t *testing.T) {
	ctx := context.Background()
	sink, proxy, db, rdb, dsn := ambiguousSink(t)
	e := enqueuedEvent(t, db)
	parked := letter(e, "retries exhausted")
	parked.FailEvent, parked.FallbackID = true, "parked-1" // as parked before keys were set up front
	body, err := json.Marshal(parked)
	require.NoError(t, err)
	require.NoError(t, rdb.RPush(ctx, dlq.FallbackKey, body).Err())

	proxy.Arm("COMMIT")
	report, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, proxy.Cuts())
	require.Equal(t, 1, report.Failed, "the entry went back to the list")
	require.Equal(t, 1, report.Moved, "and was taken again in the same run")
	require.Zero(t, report.Remaining)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM payment_events WHERE event_id='e-1' AND status='failed'`))
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1'`))
}

// TestParkedFailureAfterRecoveryFailedItWritesNoSecondRow: the worker's
// letter is parked while PostgreSQL is down, then stale recovery fails
// the same generation with its own row; the drain adds none.
func TestParkedFailureAfterRecoveryFailedItWritesNoSecondRow(t *testing.T) {
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
	require.Equal(t, "redis", sink.FailEvent(ctx, letter(e, "retries exhausted")).Sink)
	require.NoError(t, pg.Start(ctx))

	report, err := db.RecoverStale(ctx, 0, 10, postgres.StaleCursor{}, func(context.Context, postgres.StaleEvent) (postgres.RecoveryAction, string) {
		return postgres.RecoveryDeadLetter, "recovery attempts exhausted"
	})
	require.NoError(t, err)
	require.Len(t, report.DeadLettered, 1)

	drained, err := sink.Drain(ctx)
	require.NoError(t, err)
	require.Zero(t, drained.Remaining)
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1'`))
	require.Equal(t, 1, countRows(t, dsn, `SELECT count(*) FROM dead_letter_queue WHERE event_id='e-1' AND source='recovery'`))
}
