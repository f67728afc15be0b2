package test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/pkg/tracing"
	"github.com/settle/settle/pkg/worker"
	"github.com/settle/settle/test/harness"
)

type quietAlerts struct{}

func (quietAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// groupCommit is cmd/api's store: InsertEvent through the group commit.
type groupCommit struct {
	*postgres.DB
	ingest *postgres.Ingest
}

func (g groupCommit) InsertEvent(ctx context.Context, e postgres.NewEvent) (bool, error) {
	return g.ingest.InsertEvent(ctx, e)
}

// tracedPipeline is api, scheduler (enqueuer) and worker (gate on a dev
// chain, ledger, notifications) in one process, over real PostgreSQL,
// Redis, asynq and HTTP JSON-RPC, recording every span in memory: the
// binaries are separate processes, so this is where one recorder sees a
// whole trace.
type tracedPipeline struct {
	t        *testing.T
	recorder *tracetest.SpanRecorder
	db       *postgres.DB
	sql      *pgx.Conn
	chain    *devchain.Chain
	client   *harness.Client
	// startBackend starts the enqueuer and the worker: the test holds them
	// back so that its events ride in one claim and one task.
	startBackend func()
	deliver      func(context.Context) error
	received     func() []string // traceparents the notification receiver saw
}

func newTracedPipeline(t *testing.T) *tracedPipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	recorder := tracetest.NewSpanRecorder()
	restore := tracing.Use(tracing.NewProvider(sdktrace.WithSpanProcessor(recorder)))
	p := &tracedPipeline{t: t, recorder: recorder}

	dsn := testenv.DatabaseURL(t)
	p.db = testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	p.sql = conn
	rdb, err := redisconn.Open(testenv.RedisURL(t))
	require.NoError(t, err)
	p.chain, err = devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)

	var mu sync.Mutex
	var parents []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get(tracing.HeaderTraceparent))
		mu.Unlock()
	}))
	p.received = func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), parents...)
	}

	log := zerolog.Nop()
	ingest := postgres.NewIngest(p.db, 0, 0)
	server, err := httpapi.New(httpapi.Options{
		Store: groupCommit{DB: p.db, ingest: ingest}, Redis: rdb, Log: log, Registry: prometheus.NewRegistry(),
		WebhookSecret: harness.WebhookSecret, APIToken: harness.APIToken, AdminToken: harness.AdminToken,
		RateLimitTimeout: time.Minute,
	})
	require.NoError(t, err)
	api := httptest.NewServer(server)
	p.client = harness.NewClient(api.URL)

	settings := finality.ReadSettings(config.FromMap(map[string]string{
		"ETH_RPC_URL": p.chain.URL(), "DEPOSIT_FINALITY": "confirmations:1",
	}), true)
	assets, err := p.db.Assets(ctx)
	require.NoError(t, err)
	gate, closeGate, err := finality.Open(ctx, settings, finality.Deps{
		Store: p.db, Assets: assets, Redis: rdb, Alerts: quietAlerts{}, Log: log, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	p.deliver = notify.New(p.db, receiver.URL, []byte("notify-key-0123456789abcdefghijklmnop"), log, quietAlerts{}, nil).Deliver

	enqueuer := outbox.NewEnqueuer(outbox.EnqueuerOptions{
		Outbox: p.db, Client: asynq.NewClientFromRedisClient(rdb), Redis: rdb, Log: log, PollInterval: 50 * time.Millisecond,
	})
	batcher := worker.NewBatcher(p.db, postgres.LedgerOptions{Notify: true}, 32, 2, prometheus.NewRegistry())
	handler := worker.NewWorker(worker.WorkerOptions{
		Log: log, Batcher: batcher, DeadLetters: dlq.NewSink(p.db, rdb, log, nil), Alerts: quietAlerts{}, Gate: gate,
	})
	asynqServer := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: 4, Queues: worker.QueueWeights, TaskCheckInterval: 10 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond, RetryDelayFunc: worker.FullJitter(20*time.Millisecond, 40*time.Millisecond),
		IsFailure: worker.IsFailure, ShutdownTimeout: 2 * time.Second, Logger: worker.AsynqLogger{Log: log}, LogLevel: asynq.FatalLevel,
	})
	var wg sync.WaitGroup
	started := false
	p.startBackend = func() {
		started = true
		wg.Add(2)
		go func() { defer wg.Done(); enqueuer.Run(ctx) }()
		go func() { defer wg.Done(); batcher.Run(ctx) }()
		require.NoError(t, asynqServer.Start(handler))
		enqueuer.Wake()
	}
	t.Cleanup(func() {
		if started {
			asynqServer.Shutdown()
		}
		cancel()
		wg.Wait()
		api.Close()
		receiver.Close()
		ingest.Close()
		closeGate()
		_ = p.chain.Close()
		_ = rdb.Close()
		_ = conn.Close(context.Background())
		restore()
	})
	return p
}

// post sends a signed /webhook/payments deposit with the given headers.
func (p *tracedPipeline) post(fields map[string]any, headers map[string]string) (http.Header, map[string]any) {
	p.t.Helper()
	body, err := json.Marshal(fields)
	require.NoError(p.t, err)
	req, err := http.NewRequest(http.MethodPost, p.client.Base+"/webhook/payments", strings.NewReader(string(body)))
	require.NoError(p.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Signature", harness.Sign(body, harness.WebhookSecret))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := p.client.HTTP.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	answer := map[string]any{}
	require.NoError(p.t, json.NewDecoder(resp.Body).Decode(&answer))
	require.Equal(p.t, http.StatusOK, resp.StatusCode, answer)
	return resp.Header, answer
}

func (p *tracedPipeline) waitFor(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *tracedPipeline) row(id string) (status, traceID, traceparent string) {
	p.t.Helper()
	require.NoError(p.t, p.sql.QueryRow(context.Background(),
		`SELECT status, trace_id, COALESCE(traceparent, '') FROM payment_events WHERE event_id = $1`, id).Scan(&status, &traceID, &traceparent))
	return status, traceID, traceparent
}

// spansOf is every recorded span of one trace, by name.
func (p *tracedPipeline) spansOf(traceID string) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range p.recorder.Ended() {
		if s.SpanContext().TraceID().String() == traceID {
			out[s.Name()] = append(out[s.Name()], s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.String()
		}
	}
	return ""
}

// requireChild: every span named child in trace has its parent among the
// spans named parent.
func requireChild(t *testing.T, spans map[string][]sdktrace.ReadOnlySpan, parent, child string) {
	t.Helper()
	require.NotEmpty(t, spans[child], "no %s span", child)
	ids := map[trace.SpanID]bool{}
	for _, s := range spans[parent] {
		ids[s.SpanContext().SpanID()] = true
	}
	for _, s := range spans[child] {
		require.True(t, ids[s.Parent().SpanID()], "%s's parent %s is no %s span", child, s.Parent().SpanID(), parent)
	}
}

// TestOneTracePerEvent: three deposits ride in one claim and one task,
// one checked on the chain. Each has one trace, api → scheduler → worker
// → notification: the caller's traceparent's trace (or, without one, the
// trace id settle made), equal to payment_events.trace_id, the request
// span under the caller's, ingest under it, claim and enqueue under
// ingest, the worker's run under the event's own enqueue span (not its
// task neighbours'), the finality check, its RPC calls and the ledger
// commit under the run.
func TestOneTracePerEvent(t *testing.T) {
	const webhookSpan = "POST /webhook/payments"
	p := newTracedPipeline(t)
	ctx := context.Background()
	createUsers(t, p.client, 1)
	status, body, err := p.client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addrUser1, "network": "ETH_MAINNET", "user_id": 1})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	tx, err := p.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	require.NoError(t, p.chain.CommitBlocks(ctx, 2))

	const (
		traceA  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentA = "00f067aa0ba902b7"
		traceB  = "0af7651916cd43dd8448eb211c80319c"
		parentB = "b7ad6b7169203331"
	)
	_, answerA := p.post(map[string]any{"event_id": "tr-a", "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "2", "tx_hash": tx.Hash},
		map[string]string{tracing.HeaderTraceparent: "00-" + traceA + "-" + parentA + "-01"})
	require.Equal(t, traceA, answerA["trace_id"], "the caller's trace id is settle's trace_id")
	_, answerB := p.post(map[string]any{"event_id": "tr-b", "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "1"},
		map[string]string{tracing.HeaderTraceparent: "00-" + traceB + "-" + parentB + "-01"})
	require.Equal(t, traceB, answerB["trace_id"])
	headerC, answerC := p.post(map[string]any{"event_id": "tr-c", "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "3"}, nil)
	traceC, _ := answerC["trace_id"].(string)
	require.Regexp(t, `^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$`, traceC, "a new trace id is a UUID (the contract)")
	require.Equal(t, traceC, headerC.Get(httpapi.HeaderRequestID))
	// Its digits are the W3C trace id of the request's trace.
	otelC := strings.ReplaceAll(traceC, "-", "")

	p.startBackend()
	for _, id := range []string{"tr-a", "tr-b", "tr-c"} {
		p.waitFor(id+" confirmed", func() bool { status, _, _ := p.row(id); return status == "confirmed" })
	}
	p.waitFor("three notifications", func() bool {
		require.NoError(t, p.deliver(ctx))
		return len(p.received()) >= 3
	})

	taskIDs := map[string]bool{}
	for _, c := range []struct{ id, traceID, otelID, callerSpan string }{
		{"tr-a", traceA, traceA, parentA}, {"tr-b", traceB, traceB, parentB}, {"tr-c", traceC, otelC, ""},
	} {
		_, stored, traceparent := p.row(c.id)
		require.Equal(t, c.traceID, stored, "payment_events.trace_id is the answer's trace_id")
		require.Equal(t, c.otelID, tracing.TraceID(traceparent), "the stored traceparent is in the event's trace")

		spans := p.spansOf(c.otelID)
		// The request span, named by its route once routed.
		require.Len(t, spans[webhookSpan], 1, c.id)
		request := spans[webhookSpan][0]
		require.Equal(t, "200", attr(request, "http.response.status_code"))
		if c.callerSpan != "" {
			require.Equal(t, c.callerSpan, request.Parent().SpanID().String(), "the request span continues the caller's")
			require.True(t, request.Parent().IsRemote())
		} else {
			require.False(t, request.Parent().IsValid(), "without a traceparent the request span is the root")
		}
		requireChild(t, spans, webhookSpan, "ingest.insert")
		require.Len(t, spans["ingest.insert"], 1)
		require.Equal(t, spans["ingest.insert"][0].SpanContext().SpanID().String(), strings.Split(traceparent, "-")[2],
			"the row keeps the ingest span, where the scheduler goes on")
		requireChild(t, spans, "ingest.insert", "outbox.claim")
		requireChild(t, spans, "ingest.insert", "queue.enqueue")
		requireChild(t, spans, "queue.enqueue", "payment.process")
		requireChild(t, spans, "payment.process", "ledger.commit")
		for _, s := range spans["payment.process"] {
			require.Equal(t, c.id, attr(s, "settle.event_id"))
			taskIDs[attr(s, "settle.task_id")] = true
		}
		if c.id == "tr-a" {
			requireChild(t, spans, "payment.process", "finality.check")
			requireChild(t, spans, "finality.check", "chain.rpc")
		} else {
			require.Empty(t, spans["finality.check"], "a deposit without a transaction is not checked")
		}
		require.NotEmpty(t, spans["notify.deliver"], "%s: the notification is in the event's trace", c.id)
		// No span about this event strays into another trace.
		for _, s := range p.recorder.Ended() {
			if attr(s, "settle.event_id") == c.id {
				require.Equal(t, c.otelID, s.SpanContext().TraceID().String(), "%s span %s", c.id, s.Name())
			}
		}
	}
	require.Len(t, taskIDs, 1, "the three events rode in one task: %v", taskIDs)

	delivered := map[string]bool{}
	for _, tp := range p.received() {
		delivered[tracing.TraceID(tp)] = true
	}
	require.Equal(t, map[string]bool{traceA: true, traceB: true, otelC: true}, delivered,
		"each notification's receiver is told its event's trace")
}
