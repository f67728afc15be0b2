package notify_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/notify"
)

// gatedReceiver holds the i-th POST (from 0) until the test answers it
// with a status on gates[i]; every POST is counted.
type gatedReceiver struct {
	posts   atomic.Int64
	arrived chan int
	gates   [4]chan int
}

func newGatedReceiver() *gatedReceiver {
	r := &gatedReceiver{arrived: make(chan int, 4)}
	for i := range r.gates {
		r.gates[i] = make(chan int, 1)
	}
	return r
}

func (r *gatedReceiver) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	i := int(r.posts.Add(1) - 1)
	if i >= len(r.gates) {
		w.WriteHeader(http.StatusConflict)
		return
	}
	r.arrived <- i
	w.WriteHeader(<-r.gates[i])
}

func (r *gatedReceiver) waitPost(t *testing.T) int {
	t.Helper()
	select {
	case i := <-r.arrived:
		return i
	case <-time.After(10 * time.Second):
		t.Fatal("no POST arrived")
		return 0
	}
}

// expireLease makes the notification's claim run out, as a run paused
// (GC, SIGSTOP, a stalled network) past its lease finds it.
func expireLease(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	_, err := conn.Exec(context.Background(), `UPDATE notification_outbox SET next_attempt_at = now()`)
	require.NoError(t, err)
}

type outboxRow struct {
	status   string
	attempts int
	leased   bool // next_attempt_at still ahead: a claim holds it
}

func readOutbox(t *testing.T, conn *pgx.Conn) outboxRow {
	t.Helper()
	var r outboxRow
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT status, attempts, next_attempt_at > now() + interval '30 seconds' FROM notification_outbox`).Scan(&r.status, &r.attempts, &r.leased))
	return r
}

// TestStaleRunLeavesTheNewClaimAlone: run A claims a notification and is
// paused past its lease; run B (another worker) claims it and posts. A
// then finishes — its POST answered 503, or stopped before posting, so it
// gives its claim back — and must not touch B's claim: no reschedule that
// lets a third run POST beside B, no final failure that loses B's
// delivered mark, no release that makes it due while B sends.
func TestStaleRunLeavesTheNewClaimAlone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		final bool // A's attempt is the last one
	}{{"retry", false}, {"final", true}} {
		t.Run("failed "+tc.name, func(t *testing.T) {
			db, conn := oneNotification(t)
			ctx := context.Background()
			if tc.final {
				_, err := conn.Exec(ctx, `UPDATE notification_outbox SET attempts = $1 - 1`, notify.AttemptsMax)
				require.NoError(t, err)
			}
			rcv := newGatedReceiver()
			srv := httptest.NewServer(rcv)
			defer srv.Close()
			defer func() { // unblock whatever is still held, before srv.Close
				for _, g := range rcv.gates {
					select {
					case g <- http.StatusServiceUnavailable:
					default:
					}
				}
			}()
			aAlerts := &countedAlerts{}
			a := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), aAlerts, nil)
			b := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
			aDone := make(chan error, 1)
			go func() { aDone <- a.Deliver(ctx) }()
			require.Equal(t, 0, rcv.waitPost(t)) // A's POST, held: A is paused
			expireLease(t, conn)
			bDone := make(chan error, 1)
			go func() { bDone <- b.Deliver(ctx) }()
			require.Equal(t, 1, rcv.waitPost(t)) // B's POST, held
			before := readOutbox(t, conn)
			require.True(t, before.leased)

			rcv.gates[0] <- http.StatusServiceUnavailable // A resumes and fails
			require.NoError(t, <-aDone)
			assert.Equal(t, before, readOutbox(t, conn), "the stale run moved the claim another run holds")
			// Nor does it page that the notification was given up: it was
			// not, B holds it.
			assert.EqualValues(t, 0, aAlerts.raised.Load(), "the stale run raised notification_undeliverable")

			// A third run after A's backoff finds nothing due: B holds it.
			time.Sleep(2500 * time.Millisecond)
			rcv.gates[2] <- http.StatusNoContent // a third POST, if any, does not hang
			c := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
			require.NoError(t, c.Deliver(ctx))
			rcv.gates[1] <- http.StatusNoContent // B's POST delivered
			require.NoError(t, <-bDone)
			assert.EqualValues(t, 2, rcv.posts.Load(), "POSTs: A's and B's only")
			assert.Equal(t, "delivered", readOutbox(t, conn).status, "B's delivered mark")
			var logged int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM notification_deliveries`).Scan(&logged))
			require.Equal(t, 2, logged, "both attempts logged")
		})
	}

	t.Run("released", func(t *testing.T) {
		db, conn := oneNotification(t)
		ctx := context.Background()
		rcv := newGatedReceiver()
		srv := httptest.NewServer(rcv)
		defer srv.Close()
		defer func() {
			for _, g := range rcv.gates {
				select {
				case g <- http.StatusServiceUnavailable:
				default:
				}
			}
		}()
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		paused, resume := make(chan struct{}), make(chan struct{})
		// A pauses right after its claim; once resumed, it is stopped
		// (shutdown) and gives back what it did not post.
		store := &hookedStore{DB: db, afterClaim: func() { close(paused); <-resume; stop() }}
		a := notify.New(store, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
		aDone := make(chan error, 1)
		go func() { aDone <- a.Deliver(runCtx) }()
		<-paused
		expireLease(t, conn)
		b := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
		bDone := make(chan error, 1)
		go func() { bDone <- b.Deliver(ctx) }()
		require.Equal(t, 0, rcv.waitPost(t)) // B's POST, held
		before := readOutbox(t, conn)
		require.Equal(t, outboxRow{status: "pending", attempts: 2, leased: true}, before)

		close(resume)
		require.NoError(t, <-aDone)
		assert.Equal(t, before, readOutbox(t, conn), "the stale run released the claim another run holds")
		rcv.gates[1] <- http.StatusNoContent // a second POST, if any, does not hang
		c := notify.New(db, srv.URL, testKey, zerolog.New(io.Discard), noAlerts{}, nil)
		require.NoError(t, c.Deliver(ctx))
		rcv.gates[0] <- http.StatusNoContent
		require.NoError(t, <-bDone)
		assert.EqualValues(t, 1, rcv.posts.Load(), "POSTs: B's only")
		assert.Equal(t, "delivered", readOutbox(t, conn).status, "B's delivered mark")
	})
}

// countedAlerts counts what is raised.
type countedAlerts struct{ raised atomic.Int32 }

func (c *countedAlerts) Raise(string, alert.Severity, string, map[string]any) { c.raised.Add(1) }
