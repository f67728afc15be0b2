package notify_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var testKey = []byte("0123456789abcdef0123456789abcdef")

type noAlerts struct{}

func (noAlerts) Raise(string, alert.Severity, string, map[string]any) {}

// receiver is a NOTIFY_WEBHOOK_URL that can be told to fail.
type receiver struct {
	failing atomic.Bool
	mu      sync.Mutex
	got     []string // delivery ids of accepted posts
	posts   atomic.Int64
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.posts.Add(1)
	if r.failing.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var body map[string]any
	_ = json.NewDecoder(req.Body).Decode(&body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if body["delivery_id"] != req.Header.Get("X-Delivery-ID") {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.got = append(r.got, req.Header.Get("X-Delivery-ID"))
}

func setup(t *testing.T) (*postgres.DB, *pgx.Conn, payment.Event) {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("1")))
	_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "w", Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("5"), TraceID: "tr"}})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return db, conn, claimed[0].Event
}

func TestFiveDeliveriesOfOneWithdrawalNotifyOnce(t *testing.T) {
	db, _, task := setup(t)
	ctx := context.Background()
	for range 5 { // the provider delivered it five times; each task runs
		_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
		require.NoError(t, err)
	}
	r := &receiver{}
	srv := httptest.NewServer(r)
	defer srv.Close()
	d := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx))
	require.NoError(t, d.Deliver(ctx))
	require.Equal(t, []string{"insufficient_funds:w"}, r.got)
}

func TestFailingReceiverNeverTouchesThePayment(t *testing.T) {
	db, conn, task := setup(t)
	ctx := context.Background()
	results, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	require.Equal(t, payment.OutcomeInsufficientFunds, results[0].Outcome)

	r := &receiver{}
	r.failing.Store(true)
	srv := httptest.NewServer(r)
	defer srv.Close()
	d := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx))
	require.EqualValues(t, 1, r.posts.Load())

	var status, outcome string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status, outcome FROM payment_events WHERE event_id='w'`).Scan(&status, &outcome))
	require.Equal(t, "failed", status)
	require.Equal(t, "insufficient_funds", outcome)
	var dlq, attempts int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM dead_letter_queue`).Scan(&dlq))
	require.Zero(t, dlq, "a notification never lands a payment in the DLQ")
	var lastError string
	require.NoError(t, conn.QueryRow(ctx, `SELECT attempts, last_error FROM notification_outbox`).Scan(&attempts, &lastError))
	require.Equal(t, 1, attempts)
	require.Equal(t, "receiver answered HTTP 503", lastError)

	// Not due yet: the backoff holds it back.
	require.NoError(t, d.Deliver(ctx))
	require.EqualValues(t, 1, r.posts.Load())

	r.failing.Store(false)
	_, err = conn.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now()`)
	require.NoError(t, err)
	require.NoError(t, d.Deliver(ctx))
	require.Equal(t, []string{"insufficient_funds:w"}, r.got)
	var delivered string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM notification_outbox`).Scan(&delivered))
	require.Equal(t, "delivered", delivered)
}

// TestNotificationsDueFollowsTheOutbox: the scheduler's question before
// it claims a delivery period: nothing before the ledger writes a
// notification, something once it has, nothing once it is delivered, and
// nothing while a failed one waits out its backoff.
func TestNotificationsDueFollowsTheOutbox(t *testing.T) {
	db, conn, task := setup(t)
	ctx := context.Background()
	due := func() bool {
		t.Helper()
		d, err := db.NotificationsDue(ctx)
		require.NoError(t, err)
		return d
	}
	require.False(t, due(), "due before any notification")
	_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	require.True(t, due(), "the ledger's notification not due")

	r := &receiver{}
	r.failing.Store(true)
	srv := httptest.NewServer(r)
	defer srv.Close()
	d := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx))
	require.EqualValues(t, 1, r.posts.Load())
	require.False(t, due(), "due again during its backoff")

	_, err = conn.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	require.True(t, due(), "not due once its backoff ran out")
	r.failing.Store(false)
	require.NoError(t, d.Deliver(ctx))
	require.Len(t, r.got, 1)
	require.False(t, due(), "due after delivery")
}

// hookedStore is the outbox with a hook after each claim and, when set,
// a release that fails.
type hookedStore struct {
	*postgres.DB
	afterClaim func()
	releaseErr error
	claims     atomic.Int64
}

func (s *hookedStore) ClaimNotifications(ctx context.Context, limit int, lease time.Duration) ([]postgres.Notification, error) {
	s.claims.Add(1)
	due, err := s.DB.ClaimNotifications(ctx, limit, lease)
	if s.afterClaim != nil {
		s.afterClaim()
	}
	return due, err
}

func (s *hookedStore) ReleaseNotifications(ctx context.Context, unstarted []postgres.Notification) (int64, error) {
	if s.releaseErr != nil {
		return 0, s.releaseErr
	}
	return s.DB.ReleaseNotifications(ctx, unstarted)
}

// oneNotification writes one notification (a refused withdrawal's).
func oneNotification(t *testing.T) (*postgres.DB, *pgx.Conn) {
	t.Helper()
	db, conn, task := setup(t)
	_, err := db.ApplyBatch(context.Background(), []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	return db, conn
}

// requireUnspent: the notification is due now, no attempt counted, none
// logged.
func requireUnspent(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var attempts, logged int
	var due bool
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT attempts, next_attempt_at <= now() AND status = 'pending' AND last_error IS NULL,
		(SELECT count(*) FROM notification_deliveries) FROM notification_outbox`).Scan(&attempts, &due, &logged))
	require.Zero(t, attempts, "a notification never posted spent an attempt")
	require.True(t, due, "a notification never posted waits out the lease")
	require.Zero(t, logged)
}

// TestDeliverStartsOnlyWhatEndsBeforeItsDeadline: a run whose deadline
// leaves no room for a whole request posts nothing (a cut request would
// count as a failure though the receiver may answer) and gives its claim
// back at once, the attempt unspent.
func TestDeliverStartsOnlyWhatEndsBeforeItsDeadline(t *testing.T) {
	db, conn := oneNotification(t)
	var rcv receiver
	srv := httptest.NewServer(&rcv)
	defer srv.Close()
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.NoError(t, notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil).Deliver(short))
	require.Zero(t, rcv.posts.Load())
	requireUnspent(t, conn)
}

// TestStoppedDeliverGivesBackWhatItDidNotPost: a run stopped after its
// claim (the worker shutting down) posts nothing more and releases the
// rest; a release that fails leaves them to the lease, logged.
func TestStoppedDeliverGivesBackWhatItDidNotPost(t *testing.T) {
	db, conn := oneNotification(t)
	var rcv receiver
	srv := httptest.NewServer(&rcv)
	defer srv.Close()
	ctx, stop := context.WithCancel(context.Background())
	store := &hookedStore{DB: db, afterClaim: stop}
	require.NoError(t, notify.New(store, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil).Deliver(ctx))
	require.Zero(t, rcv.posts.Load())
	requireUnspent(t, conn)

	ctx, stop = context.WithCancel(context.Background())
	defer stop()
	logs := &strings.Builder{}
	store = &hookedStore{DB: db, afterClaim: stop, releaseErr: errors.New("connection refused")}
	require.NoError(t, notify.New(store, srv.URL, testKey, zerolog.New(&syncWriter{w: logs}), noAlerts{}, nil).Deliver(ctx))
	require.Zero(t, rcv.posts.Load())
	require.Contains(t, logs.String(), "unsent notifications not released")
	var attempts int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT attempts FROM notification_outbox`).Scan(&attempts))
	require.Equal(t, 1, attempts, "left to the lease")
}

// TestOneDeliveryRunAtATime: a run may last up to the lease; one called
// meanwhile returns at once without claiming.
func TestOneDeliveryRunAtATime(t *testing.T) {
	db, _ := oneNotification(t)
	release := make(chan struct{})
	posted := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posted <- struct{}{}
		<-release
	}))
	defer srv.Close()
	var once sync.Once
	answer := func() { once.Do(func() { close(release) }) }
	defer answer() // before srv.Close, which waits for the handler
	store := &hookedStore{DB: db}
	d := notify.New(store, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	done := make(chan error, 1)
	go func() { done <- d.Deliver(context.Background()) }()
	<-posted
	require.NoError(t, d.Deliver(context.Background()))
	require.EqualValues(t, 1, store.claims.Load(), "a second run claimed while the first was posting")
	answer()
	require.NoError(t, <-done)
	require.NoError(t, d.Deliver(context.Background()))
	require.EqualValues(t, 2, store.claims.Load(), "the next run after it claims")
}
