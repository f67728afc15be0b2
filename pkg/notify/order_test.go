package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// settleNotifying accepts e as the api would, claims it as the enqueuer
// does and runs it through the ledger with notifications on.
func settleNotifying(t *testing.T, db *postgres.DB, e payment.Event) postgres.LedgerResult {
	t.Helper()
	ctx := context.Background()
	e.TraceID = "trace-" + e.ID
	inserted, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	claimed, err := db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	res, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	return res[0]
}

// mirror is a receiver that keeps each user's balance from notifications,
// by the highest sequence it has seen, as the README tells receivers to.
type mirror struct {
	mu        sync.Mutex
	failOnce  map[string]bool // delivery ids answered 503 the first time
	arrived   []string
	sequence  map[float64]float64
	balance   map[float64]string
	available map[float64]string
}

func (m *mirror) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var p map[string]any
	_ = json.Unmarshal(body, &p)
	m.mu.Lock()
	defer m.mu.Unlock()
	id := req.Header.Get("webhook-id")
	if m.failOnce[id] {
		delete(m.failOnce, id)
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	m.arrived = append(m.arrived, id)
	user, _ := p["user_id"].(float64)
	seq, _ := p["sequence"].(float64) // without one, the last to arrive wins
	if seq >= m.sequence[user] {
		m.sequence[user] = seq
		m.balance[user], _ = p["balance"].(string)
		m.available[user], _ = p["available"].(string)
	}
}

func newMirror() *mirror {
	return &mirror{failOnce: map[string]bool{}, sequence: map[float64]float64{}, balance: map[float64]string{}, available: map[float64]string{}}
}

// TestNotificationsCarryTheirOrder: two deposits of one user settle one
// after the other; the first one's POST meets a 503 and arrives after
// the second, with the older balance. Each body's sequence orders them,
// so a receiver keeping the highest shows the balance the user has
// (nothing in a body ordered them, and such a receiver showed 2 of 3).
func TestNotificationsCarryTheirOrder(t *testing.T) {
	db := testenv.OpenDB(t, testenv.DatabaseURL(t))
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("1")))
	one := decimal.RequireFromString("1")
	for _, id := range []string{"d1", "d2"} {
		require.Equal(t, payment.StatusConfirmed, settleNotifying(t, db, payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: one}).Status)
	}

	m := newMirror()
	m.failOnce["deposit_credited:d1"] = true
	srv := httptest.NewServer(m)
	defer srv.Close()
	d := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx)) // d1: 503, d2: delivered
	time.Sleep(notify.BackoffFirst + 200*time.Millisecond)
	require.NoError(t, d.Deliver(ctx)) // d1 again: delivered, last
	require.Equal(t, []string{"deposit_credited:d2", "deposit_credited:d1"}, m.arrived)
	require.Equal(t, "3", m.balance[1], "the later balance, whatever came last")
}

// TestRefusalNotifiesBalanceAndAvailable: with 8 of 10 ETH held, a
// refused withdrawal's notification says balance 10 and available 2 (its
// "balance" was the available amount, unlike every other kind's).
func TestRefusalNotifiesBalanceAndAvailable(t *testing.T) {
	db := testenv.OpenDB(t, testenv.DatabaseURL(t))
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, db.SetInitialBalance(ctx, 1, "ETH", decimal.RequireFromString("10")))
	res := settleNotifying(t, db, payment.Event{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH",
		Amount: decimal.RequireFromString("8"), Network: "ETH_MAINNET", ToAddress: "0x00000000000000000000000000000000000000aa"})
	require.Equal(t, payment.OutcomeHeld, res.Outcome)
	res = settleNotifying(t, db, payment.Event{ID: "w1", Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("5")})
	require.Equal(t, payment.OutcomeInsufficientFunds, res.Outcome)

	m := newMirror()
	srv := httptest.NewServer(m)
	defer srv.Close()
	require.NoError(t, notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil).Deliver(ctx))
	require.Equal(t, []string{"insufficient_funds:w1"}, m.arrived)
	require.Equal(t, "10", m.balance[1])
	require.Equal(t, "2", m.available[1])
}
