package worker_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/task"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/pkg/worker"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// alerts records what would have reached a human.
type alerts struct {
	mu   sync.Mutex
	keys []string
}

func (a *alerts) Raise(key string, _ alert.Severity, _ string, _ map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, key)
}

func (a *alerts) count(prefix string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, k := range a.keys {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			n++
		}
	}
	return n
}

// pipeline is the scheduler's enqueuer and a worker, in process, on real
// PostgreSQL, Redis and asynq.
type pipeline struct {
	t        *testing.T
	dsn      string
	db       *postgres.DB
	sql      *pgx.Conn
	redisURL string
	rdb      redis.UniversalClient
	sink     *dlq.Sink
	alerts   *alerts
	enqueuer *outbox.Enqueuer
	recovery *outbox.Recovery
	server   *asynq.Server
	stop     func()
}

type pipelineOptions struct {
	dsn        string // default: a fresh database on the shared server
	redisURL   string // default: a private database on the shared server
	noWorker   bool
	noEnqueuer bool // tests hand tasks to asynq themselves
	retryDelay time.Duration
	lock       time.Duration
	// contentionWindow: RETRY_CONTENTION_WINDOW (0: contention spends the
	// budget at once).
	contentionWindow time.Duration
	// workerConns: the ledger gets a pool of its own, this small, so a
	// test can warm every connection it uses (0: it shares p.db).
	workerConns int32
	// batchTimeout bounds a ledger transaction (0: the batcher's 30 s).
	batchTimeout time.Duration
	// log gets the pipeline's log lines too (nil: none but the test's,
	// when verbose).
	log io.Writer
}

func newPipeline(t *testing.T, o pipelineOptions) *pipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if o.dsn == "" {
		o.dsn = testenv.DatabaseURL(t)
	}
	p := &pipeline{t: t, dsn: o.dsn, alerts: &alerts{}}
	p.db = testenv.OpenDB(t, p.dsn)
	conn, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	p.sql = conn
	if o.redisURL == "" {
		o.redisURL = testenv.RedisURL(t)
	}
	p.redisURL = o.redisURL
	p.rdb, err = redisconn.Open(o.redisURL)
	require.NoError(t, err)
	out := io.Discard
	if testing.Verbose() {
		out = zerolog.NewTestWriter(t)
	}
	if o.log != nil {
		out = io.MultiWriter(out, o.log)
	}
	log := zerolog.New(out)
	p.sink = dlq.NewSink(p.db, p.rdb, log, nil)
	p.enqueuer = outbox.NewEnqueuer(outbox.EnqueuerOptions{
		Outbox: p.db, Client: asynq.NewClientFromRedisClient(p.rdb), Redis: p.rdb, Log: log,
		PollInterval: 50 * time.Millisecond,
	})
	p.recovery = &outbox.Recovery{
		Store: p.db, Inspector: asynq.NewInspectorFromRedisClient(p.rdb), Alerts: p.alerts, Log: log,
		StaleAfter: time.Second, MaxAttempts: 3, BatchMax: 100,
	}
	var wg sync.WaitGroup
	if !o.noEnqueuer {
		wg.Add(1)
		go func() { defer wg.Done(); p.enqueuer.Run(ctx) }()
	}
	if !o.noWorker {
		if o.retryDelay == 0 {
			o.retryDelay = 20 * time.Millisecond
		}
		ledgerDB := p.db
		if o.workerConns > 0 {
			ledgerDB, err = postgres.Open(ctx, p.dsn, postgres.Options{ConnsMax: o.workerConns, ApplicationName: "settle-test-ledger"})
			require.NoError(t, err)
			t.Cleanup(ledgerDB.Close)
		}
		batcher := worker.NewBatcher(ledgerDB, postgres.LedgerOptions{LockTimeout: o.lock, Notify: true}, 32, 2, prometheus.NewRegistry())
		if o.batchTimeout > 0 {
			batcher.BoundBatches(o.batchTimeout)
		}
		handler := worker.NewWorker(worker.WorkerOptions{
			Log: log, Batcher: batcher, DeadLetters: p.sink, Alerts: p.alerts,
			Redis: p.rdb, ContentionWindow: o.contentionWindow,
		})
		wg.Add(1)
		go func() { defer wg.Done(); batcher.Run(ctx) }()
		p.server = asynq.NewServerFromRedisClient(p.rdb, asynq.Config{
			Concurrency: 16, Queues: worker.QueueWeights, TaskCheckInterval: 10 * time.Millisecond,
			DelayedTaskCheckInterval: 50 * time.Millisecond,
			RetryDelayFunc:           worker.FullJitter(o.retryDelay, 2*o.retryDelay), IsFailure: worker.IsFailure, ShutdownTimeout: 2 * time.Second,
			Logger: worker.AsynqLogger{Log: log}, LogLevel: asynq.FatalLevel,
		})
		require.NoError(t, p.server.Start(handler))
	}
	p.stop = func() {
		if p.server != nil {
			p.server.Shutdown()
		}
		cancel()
		wg.Wait()
		_ = p.rdb.Close()
		conn.Close(context.Background())
	}
	t.Cleanup(p.stop)
	return p
}

// otherRedis is a second client of the pipeline's Redis, opened from its
// URL: a client made from p.rdb's Options() shares state that go-redis
// writes while p.rdb dials (its maintenance-notifications mode), a data
// race the race detector reports.
func (p *pipeline) otherRedis() *redis.Client {
	c, err := redisconn.Open(p.redisURL)
	require.NoError(p.t, err)
	client, ok := c.(*redis.Client)
	require.True(p.t, ok, "the pipeline's Redis is not a single server")
	p.t.Cleanup(func() { _ = client.Close() })
	return client
}
func (p *pipeline) user(id int64, initial map[string]string) {
	p.t.Helper()
	_, err := p.db.CreateUser(context.Background(), id)
	require.NoError(p.t, err)
	for asset, amount := range initial {
		require.NoError(p.t, p.db.SetInitialBalance(context.Background(), id, asset, decimal.RequireFromString(amount)))
	}
}

func (p *pipeline) accept(id string, typ payment.EventType, user int64, asset, amount string) {
	p.t.Helper()
	_, err := p.db.InsertEvent(context.Background(), postgres.NewEvent{Event: payment.Event{
		ID: id, Type: typ, UserID: user, Asset: asset, Amount: decimal.RequireFromString(amount), TraceID: "t-" + id,
	}})
	require.NoError(p.t, err)
	p.enqueuer.Wake()
}

func (p *pipeline) count(query string, args ...any) int {
	p.t.Helper()
	var n int
	require.NoError(p.t, p.sql.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func (p *pipeline) waitFor(what string, timeout time.Duration, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *pipeline) balance(user int64, asset string) string {
	p.t.Helper()
	var b string
	require.NoError(p.t, p.sql.QueryRow(context.Background(), `SELECT balance::text FROM balances WHERE user_id = $1 AND asset = $2`, user, asset).Scan(&b))
	return decimal.RequireFromString(b).String()
}

func (p *pipeline) allTerminal() bool {
	return p.count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed', 'failed')`) == 0
}

func (p *pipeline) requireInvariants() {
	p.t.Helper()
	require.Zero(p.t, p.count(`SELECT count(*) FROM balances b
		WHERE b.balance <> b.initial_balance + COALESCE((SELECT SUM(amount) FROM balance_events e WHERE e.user_id=b.user_id AND e.asset=b.asset), 0)`))
	require.Zero(p.t, p.count(`SELECT count(*) FROM (SELECT 1 FROM balance_events GROUP BY source_event_id, event_type HAVING count(*) > 1) d`))
	require.Zero(p.t, p.count(`SELECT count(*) FROM payment_events e WHERE e.status = 'confirmed'
		AND (SELECT count(*) FROM balance_events b WHERE b.source_event_id = e.event_id) <> 1`))
	require.Zero(p.t, p.count(`SELECT count(*) FROM payment_events e WHERE e.status = 'failed' AND e.outcome = 'dead_lettered'
		AND NOT EXISTS (SELECT 1 FROM dead_letter_queue d WHERE d.event_id = e.event_id)`))
}

func TestPipelineCreditsEveryDepositOnce(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	for u := int64(1); u <= 5; u++ {
		p.user(u, nil)
	}
	const n = 300
	for i := range n {
		p.accept(fmt.Sprintf("dep-%d", i), payment.Deposit, int64(i%5+1), "ETH", "0.1")
	}
	// Duplicate tasks straight into the queue, as a redelivery would.
	client := asynq.NewClientFromRedisClient(p.rdb)
	p.waitFor("all confirmed", 60*time.Second, p.allTerminal)
	for i := 0; i < n; i += 7 {
		e := payment.Event{ID: fmt.Sprintf("dep-%d", i), Type: payment.Deposit, UserID: int64(i%5 + 1), Asset: "ETH", Amount: decimal.RequireFromString("0.1")}
		queued, opts, err := task.NewPaymentTask(postgres.Claimed{Event: e})
		require.NoError(t, err)
		opts = append(opts, asynq.TaskID(fmt.Sprintf("dup-%d", i)))
		_, err = client.Enqueue(queued, opts...)
		require.NoError(t, err)
	}
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("duplicates drained", 30*time.Second, func() bool {
		info, err := inspector.GetQueueInfo(task.QueuePayments)
		return err == nil && info.Pending == 0 && info.Active == 0
	})
	var failures []string
	rows, err := p.sql.Query(context.Background(), `SELECT event_id || ' ' || COALESCE(outcome, '') || ' ' || COALESCE(error, '') FROM payment_events WHERE status <> 'confirmed'`)
	require.NoError(t, err)
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		failures = append(failures, line)
	}
	require.Empty(t, failures)
	require.Equal(t, n, p.count(`SELECT count(*) FROM payment_events WHERE status='confirmed'`))
	require.Equal(t, n, p.count(`SELECT count(*) FROM balance_events`))
	var total string
	require.NoError(t, p.sql.QueryRow(context.Background(), `SELECT SUM(balance)::text FROM balances`).Scan(&total))
	require.True(t, decimal.RequireFromString(total).Equal(decimal.RequireFromString("30")), total)
	p.requireInvariants()
}

// TestExhaustedRetriesEndInTheDLQ holds a balance row locked for good: the
// withdrawal's every attempt times out, and after the last retry it must
// end failed with a DLQ row, not stranded in 'enqueued' (the seed's bug).
// Its lock timeouts are contention: they retry free for the contention
// window from the first, then spend the budget, so the DLQ comes after
// the window and within a budget of it, never forever.
func TestExhaustedRetriesEndInTheDLQ(t *testing.T) {
	const window = 2 * time.Second
	p := newPipeline(t, pipelineOptions{lock: 50 * time.Millisecond, retryDelay: 10 * time.Millisecond, contentionWindow: window})
	p.user(1, map[string]string{"USDT": "100"})
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id=1 AND asset='USDT' FOR UPDATE`)
	require.NoError(t, err)

	started := time.Now()
	p.accept("w-locked", payment.Withdrawal, 1, "USDT", "5")
	p.waitFor("dead-lettered", 60*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE event_id='w-locked' AND status='failed'`) == 1
	})
	took := time.Since(started)
	require.NoError(t, tx.Rollback(ctx))
	require.GreaterOrEqual(t, took, window, "dead-lettered within the contention window")
	require.Less(t, took, window+15*time.Second, "contention retried long past the window and a budget")
	// The window's start outlives the window by a day, so a task that
	// keeps retrying never starts it again.
	var taskID string
	require.NoError(t, p.sql.QueryRow(ctx, `SELECT task_id FROM payment_events WHERE event_id = 'w-locked'`).Scan(&taskID))
	ttl, err := p.rdb.PTTL(ctx, worker.ContentionKey(taskID)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 24*time.Hour)
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id='w-locked' AND outcome='dead_lettered'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id='w-locked' AND source='worker' AND attempt = $1`, task.RetryMax+1))
	// The alert is raised after the event's failed row is committed.
	p.waitFor("the dead letter's alert", 30*time.Second, func() bool { return p.alerts.count("dead_letter:retries_exhausted") == 1 })
	require.Zero(t, p.count(`SELECT count(*) FROM balance_events`))
	p.requireInvariants()
}

func TestWithdrawalsRacingThroughTheQueueNeverOverdraw(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	p.user(1, map[string]string{"ETH": "100"})
	p.user(2, map[string]string{"ETH": "50"})
	for i := range 60 {
		p.accept(fmt.Sprintf("w1-%d", i), payment.Withdrawal, 1, "ETH", "2.5")  // 40 fit
		p.accept(fmt.Sprintf("w2-%d", i), payment.WithdrawalFee, 2, "ETH", "1") // 50 fit
	}
	p.waitFor("all terminal", 60*time.Second, p.allTerminal)
	require.Equal(t, 40, p.count(`SELECT count(*) FROM payment_events WHERE user_id=1 AND status='confirmed'`))
	require.Equal(t, 20, p.count(`SELECT count(*) FROM payment_events WHERE user_id=1 AND outcome='insufficient_funds'`))
	require.Equal(t, 50, p.count(`SELECT count(*) FROM payment_events WHERE user_id=2 AND status='confirmed'`))
	require.Zero(t, p.count(`SELECT count(*) FROM balances WHERE balance <> 0`))
	p.requireInvariants()
}

// TestRecoveryBringsBackTasksTheQueueLost flushes Redis after events were
// enqueued: stale recovery must send them through again, with a new
// generation, and everything completes.
func TestRecoveryBringsBackTasksTheQueueLost(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true})
	p.user(1, nil)
	for i := range 20 {
		p.accept(fmt.Sprintf("lost-%d", i), payment.Deposit, 1, "WBTC", "0.00000001")
	}
	p.waitFor("all enqueued", 10*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE status='enqueued'`) == 20
	})
	require.NoError(t, p.rdb.FlushDB(context.Background()).Err()) // the queue loses everything
	time.Sleep(1100 * time.Millisecond)                           // past StaleAfter
	require.NoError(t, p.recovery.Run(context.Background()))
	require.Equal(t, 20, p.count(`SELECT count(*) FROM payment_events WHERE retry_count=1 AND generation=1`))

	// A worker now finds the re-enqueued tasks under their new ids.
	batcher := worker.NewBatcher(p.db, postgres.LedgerOptions{}, 32, 2, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go batcher.Run(ctx)
	server := asynq.NewServerFromRedisClient(p.rdb, asynq.Config{Concurrency: 8, Queues: worker.QueueWeights, TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	require.NoError(t, server.Start(worker.NewWorker(worker.WorkerOptions{Log: zerolog.Nop(), Batcher: batcher, DeadLetters: p.sink, Alerts: p.alerts})))
	defer server.Shutdown()
	p.waitFor("all confirmed", 30*time.Second, p.allTerminal)
	require.Equal(t, 20, p.count(`SELECT count(*) FROM payment_events WHERE status='confirmed'`))
	p.requireInvariants()
}

// TestRecoveryDeadLettersWhenTheQueueStaysDown keeps the queue unreachable
// for longer than MaxAttempts recoveries: the events end failed with a
// DLQ row and an alert, never silently stuck.
func TestRecoveryDeadLettersWhenTheQueueStaysDown(t *testing.T) {
	p := newPipeline(t, pipelineOptions{noWorker: true})
	// Nothing here races the bound (no worker, a dead queue): a short one
	// keeps the four rounds' waits short.
	p.recovery.StaleAfter = 200 * time.Millisecond
	p.user(1, nil)
	p.accept("stuck-1", payment.Deposit, 1, "ETH", "1")
	p.waitFor("enqueued", 10*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE status='enqueued'`) == 1
	})
	// The queue is gone for good: nothing the enqueuer sends arrives.
	deadQueue, err := redisconn.Open("redis://127.0.0.1:1/0")
	require.NoError(t, err)
	p.recovery.Inspector = asynq.NewInspectorFromRedisClient(deadQueue)
	require.NoError(t, p.rdb.FlushDB(context.Background()).Err())
	for attempt := 0; attempt <= p.recovery.MaxAttempts; attempt++ {
		// Back to enqueued (the enqueuer claims it again), stale, recovered.
		p.waitFor("re-enqueued", 10*time.Second, func() bool {
			return p.count(`SELECT count(*) FROM payment_events WHERE status IN ('enqueued','failed')`) == 1
		})
		require.NoError(t, p.rdb.FlushDB(context.Background()).Err())
		time.Sleep(p.recovery.StaleAfter + 100*time.Millisecond)
		require.NoError(t, p.recovery.Run(context.Background()))
	}
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id='stuck-1' AND status='failed' AND outcome='dead_lettered'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id='stuck-1' AND source='recovery'`))
	require.Equal(t, 1, p.alerts.count("recovery_dead_letter"))
	require.Equal(t, p.recovery.MaxAttempts+1, p.count(`SELECT retry_count FROM payment_events WHERE event_id='stuck-1'`))
}

func TestUnknownTaskTypeIsDeadLetteredWithoutRetry(t *testing.T) {
	p := newPipeline(t, pipelineOptions{})
	client := asynq.NewClientFromRedisClient(p.rdb)
	_, err := client.Enqueue(asynq.NewTask("payment:refund", []byte(`{"event_id":"x"}`)), asynq.Queue(task.QueuePayments), asynq.MaxRetry(5))
	require.NoError(t, err)
	p.waitFor("dead letter", 20*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_type='payment:refund'`) == 1
	})
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("archived", 10*time.Second, func() bool {
		info, err := inspector.GetQueueInfo(task.QueuePayments)
		return err == nil && info.Archived == 1 && info.Retry == 0
	})

	// The same task run again (as after a worker that died once its row
	// was committed) writes no second row.
	archived, err := inspector.ListArchivedTasks(task.QueuePayments)
	require.NoError(t, err)
	require.Len(t, archived, 1)
	require.NoError(t, inspector.RunTask(task.QueuePayments, archived[0].ID))
	p.waitFor("archived again", 20*time.Second, func() bool {
		info, err := inspector.GetQueueInfo(task.QueuePayments)
		return err == nil && info.Archived == 1 && info.Pending == 0 && info.Active == 0
	})
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_type='payment:refund'`), "one row for one task")
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE fallback_id='unknown_type:`+archived[0].ID+`'`))
}

// TestPostgresOutageDoesNotSpendRetries keeps PostgreSQL down while the
// worker holds tasks, for longer than five quick retries would last: the
// tasks keep retrying off budget and every event completes once the
// database is back, none dead-lettered.
func TestPostgresOutageDoesNotSpendRetries(t *testing.T) {
	ctx := context.Background()
	pg, dsn := outagePostgres(t)

	// A long lock timeout: the tasks wait on the held row, not fail.
	p := newPipeline(t, pipelineOptions{dsn: dsn, retryDelay: 10 * time.Millisecond, lock: 30 * time.Second})
	p.user(1, map[string]string{"ETH": "0"})
	// count opens a connection per question: PostgreSQL restarts below.
	count := func(query string) int {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return -1
		}
		defer conn.Close(ctx)
		n := -1
		_ = conn.QueryRow(ctx, query).Scan(&n)
		return n
	}
	// Hold the balance row so the tasks are in the worker when the
	// database goes away.
	holder, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	// Referenced until the end: a collected connection closes its socket
	// and PostgreSQL would drop the lock with it.
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	locked, err := tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id = 1 FOR UPDATE`)
	require.NoError(t, err)
	require.EqualValues(t, 1, locked.RowsAffected())
	for i := range 30 {
		p.accept(fmt.Sprintf("outage-%d", i), payment.Deposit, 1, "ETH", "1")
	}
	p.waitFor("tasks in flight", 10*time.Second, func() bool {
		return count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued'`) == 30
	})
	pg.Stop()                   // ends the holder's transaction too
	time.Sleep(3 * time.Second) // five retries at 10-20 ms would be long spent
	require.NoError(t, pg.Start(ctx))
	p.waitFor("all confirmed", 60*time.Second, func() bool {
		return count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`) == 30
	})
	require.Zero(t, count(`SELECT count(*) FROM dead_letter_queue`))
	require.Equal(t, 30, count(`SELECT count(*) FROM balance_events`))
}

// TestOneTaskManyEventsEachSettledOnItsOwn sends one task with events of
// every fate: a deposit, a withdrawal without funds, one the task
// describes wrongly, and one whose balance row is held. Each settles on
// its own; the held one makes the task retry, and the retry neither
// credits the deposit again nor records the rejected event twice.
func TestOneTaskManyEventsEachSettledOnItsOwn(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{noEnqueuer: true, lock: 100 * time.Millisecond, retryDelay: 100 * time.Millisecond})
	p.user(1, map[string]string{"ETH": "1"})
	p.user(2, map[string]string{"USDT": "0"})
	p.user(3, map[string]string{"DAI": "100"})
	p.accept("b-deposit", payment.Deposit, 1, "ETH", "1")
	p.accept("b-broke", payment.Withdrawal, 2, "USDT", "5")
	p.accept("b-wrong", payment.Deposit, 1, "ETH", "2")
	p.accept("b-held", payment.Withdrawal, 3, "DAI", "10")
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 32)
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	for i, c := range claimed {
		require.Equal(t, claimed[0].TaskID, c.TaskID, "one claim of four fits one task")
		if c.Event.ID == "b-wrong" {
			claimed[i].Event.Amount = decimal.RequireFromString("3") // not what was stored
		}
	}

	holder, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id = 3 FOR UPDATE`)
	require.NoError(t, err)

	queued, opts, err := task.NewPaymentBatch(claimed)
	require.NoError(t, err)
	_, err = asynq.NewClientFromRedisClient(p.rdb).Enqueue(queued, opts...)
	require.NoError(t, err)
	inspector := asynq.NewInspectorFromRedisClient(p.rdb)
	p.waitFor("the task retrying", 20*time.Second, func() bool {
		info, err := inspector.GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
		return err == nil && info.Retried >= 2
	})
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'b-deposit' AND status = 'confirmed'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'b-broke' AND outcome = 'insufficient_funds'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'b-held' AND status = 'enqueued'`))
	require.NoError(t, tx.Rollback(ctx))

	p.waitFor("the held withdrawal", 20*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'b-held' AND status = 'confirmed'`) == 1
	})
	p.waitFor("the task archived for its rejected event", 20*time.Second, func() bool {
		info, err := inspector.GetTaskInfo(task.QueuePayments, claimed[0].TaskID)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	require.Equal(t, 1, p.count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'b-deposit'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'b-wrong'`), "recorded once over all attempts")
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'b-wrong' AND status = 'enqueued'`), "a wrong task leaves the event to recovery")
	require.Zero(t, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id <> 'b-wrong'`))
	require.Equal(t, "90", p.balance(3, "DAI"))
	require.Equal(t, "2", p.balance(1, "ETH"))
	p.requireInvariants()
}

// TestRecoveryAsksAboutATaskOnceForAllItsEvents loses a task of many
// events: recovery brings every one of them back.
func TestRecoveryAsksAboutATaskOnceForAllItsEvents(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	p.user(1, nil)
	for i := range 10 {
		p.accept(fmt.Sprintf("batch-%d", i), payment.Deposit, 1, "ETH", "1")
	}
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 4)
	require.NoError(t, err)
	tasks := map[string]int{}
	for _, c := range claimed {
		tasks[c.TaskID]++
	}
	require.Len(t, tasks, 3, "ten events in tasks of four: %v", tasks)
	client := asynq.NewClientFromRedisClient(p.rdb)
	var lost string
	for id := range tasks {
		var events []postgres.Claimed
		for _, c := range claimed {
			if c.TaskID == id {
				events = append(events, c)
			}
		}
		queued, opts, err := task.NewPaymentBatch(events)
		require.NoError(t, err)
		_, err = client.Enqueue(queued, opts...)
		require.NoError(t, err)
		lost = id
	}
	require.NoError(t, asynq.NewInspectorFromRedisClient(p.rdb).DeleteTask(task.QueuePayments, lost))
	questions := &countingInspector{TaskInspector: p.recovery.Inspector}
	p.recovery.Inspector = questions
	time.Sleep(1100 * time.Millisecond) // past StaleAfter
	require.NoError(t, p.recovery.Run(ctx))
	require.EqualValues(t, len(tasks), questions.calls.Load(), "one question per task, not per event")
	require.Equal(t, tasks[lost], p.count(`SELECT count(*) FROM payment_events WHERE status = 'pending' AND generation = 1 AND task_id = $1`, lost))
	require.Equal(t, 10-tasks[lost], p.count(`SELECT count(*) FROM payment_events WHERE status = 'enqueued' AND generation = 0`), "the others still wait in the queue")
}

// countingInspector counts the questions recovery asks the real asynq.
type countingInspector struct {
	outbox.TaskInspector
	calls atomic.Int64
}

func (c *countingInspector) GetTaskInfo(queueName, id string) (*asynq.TaskInfo, error) {
	c.calls.Add(1)
	return c.TaskInspector.GetTaskInfo(queueName, id)
}

// TestPoisonEventReachesTheDLQ: an error no outage explains (here a row
// the ledger cannot read) spends the event's retries and ends in the DLQ,
// instead of retrying forever as if PostgreSQL were down.
func TestPoisonEventReachesTheDLQ(t *testing.T) {
	p := newPipeline(t, pipelineOptions{retryDelay: 10 * time.Millisecond, noEnqueuer: true})
	p.user(1, nil)
	ctx := context.Background()
	p.accept("poison", payment.Deposit, 1, "ETH", "1")
	claimed, err := p.db.ClaimOutbox(ctx, 10, 0, 1)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	// A NULL where the ledger reads text: its Scan fails on every try.
	_, err = p.sql.Exec(ctx, `ALTER TABLE payment_events ALTER COLUMN trace_id DROP NOT NULL`)
	require.NoError(t, err)
	_, err = p.sql.Exec(ctx, `UPDATE payment_events SET trace_id = NULL WHERE event_id = 'poison'`)
	require.NoError(t, err)
	queued, opts, err := task.NewPaymentTask(claimed[0])
	require.NoError(t, err)
	_, err = asynq.NewClientFromRedisClient(p.rdb).Enqueue(queued, opts...)
	require.NoError(t, err)

	p.waitFor("dead-lettered", 60*time.Second, func() bool {
		return p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'poison'`) > 0
	})
	require.Equal(t, 1, p.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'poison' AND attempt = $1`, task.RetryMax+1),
		"every retry was spent, then one dead letter")
	require.Zero(t, p.count(`SELECT count(*) FROM balance_events`))
}
