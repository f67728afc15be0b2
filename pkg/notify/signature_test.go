package notify_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/postgres"
)

// verifyStandardWebhook is the receiver's side of the Standard Webhooks
// spec, written from the spec and not from settle's code: the key of a
// whsec_ secret is the base64 after the prefix; the signed content is
// id.timestamp.body; the header is a space-separated list of
// version,signature pairs of which one v1 must match; the timestamp must
// be within tolerance of now.
func verifyStandardWebhook(secret string, h http.Header, body []byte, now time.Time) bool {
	var key []byte
	if rest, ok := strings.CutPrefix(secret, "whsec_"); ok {
		var err error
		if key, err = base64.StdEncoding.DecodeString(rest); err != nil {
			return false
		}
	} else {
		key = []byte(secret)
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return false
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(unix, 0)).Abs() > 5*time.Minute {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, pair := range strings.Split(sigs, " ") {
		version, sig, ok := strings.Cut(pair, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// A spec test vector (the Standard Webhooks libraries' own): the
// independent verifier above must accept it, or it is not the spec.
func TestVerifierAgreesWithTheSpecVector(t *testing.T) {
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	require.True(t, verifyStandardWebhook(secret, h, body, time.Unix(1614265330, 0)))
	require.False(t, verifyStandardWebhook(secret, h, []byte(`{"test": 2432232315}`), time.Unix(1614265330, 0)))

	key, err := notify.ParseSecret(secret)
	require.NoError(t, err)
	require.Equal(t, h.Get("webhook-signature"), notify.Sign(key, h.Get("webhook-id"), time.Unix(1614265330, 0), body))
}

func TestParseSecret(t *testing.T) {
	key, err := notify.ParseSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdefghijklmn")))
	require.NoError(t, err)
	require.Equal(t, []byte("0123456789abcdefghijklmn"), key)
	key, err = notify.ParseSecret(strings.Repeat("k", 32))
	require.NoError(t, err)
	require.Equal(t, []byte(strings.Repeat("k", 32)), key, "anything else is its literal bytes")

	for secret, msg := range map[string]string{
		"whsec_" + base64.StdEncoding.EncodeToString([]byte("short")): "at least 24 bytes",
		"whsec_not*base64!":                "not base64",
		strings.Repeat("k", 31):            "at least 32 characters",
		"whsec_":                           "at least 24 bytes",
		"whsec_" + strings.Repeat("=", 40): "not base64",
	} {
		_, err := notify.ParseSecret(secret)
		require.ErrorContains(t, err, msg, secret)
	}
}

// signedReceiver verifies every POST with the independent verifier and
// answers 401 to one that fails.
type signedReceiver struct {
	secret string
	mu     sync.Mutex
	good   []string // webhook-id of verified posts
	bad    int
	tamper func(h http.Header, body []byte) []byte
}

func (r *signedReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tamper != nil {
		body = r.tamper(req.Header, body)
	}
	if !verifyStandardWebhook(r.secret, req.Header, body, time.Now()) {
		r.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	r.good = append(r.good, req.Header.Get("webhook-id"))
}

func (r *signedReceiver) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.good), r.bad
}

func TestSignedDeliveryLogAndRedelivery(t *testing.T) {
	db, conn, task := setup(t)
	ctx := context.Background()
	_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)

	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a-24-byte-or-longer-key!!"))
	key, err := notify.ParseSecret(secret)
	require.NoError(t, err)
	r := &signedReceiver{secret: secret}
	// First the receiver sees a tampered body: the signature must not hold.
	r.tamper = func(_ http.Header, body []byte) []byte {
		var m map[string]any
		require.NoError(t, json.Unmarshal(body, &m))
		m["amount"] = "5000"
		out, _ := json.Marshal(m)
		return out
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	d := notify.New(db, srv.URL+"/hooks/SECRETPATH", key, zerolog.New(io.Discard), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx))
	good, bad := r.counts()
	require.Equal(t, 0, good)
	require.Equal(t, 1, bad, "a tampered body fails verification")

	// A tampered timestamp or id fails too.
	for _, header := range []string{"webhook-timestamp", "webhook-id"} {
		r.mu.Lock()
		r.tamper = func(h http.Header, body []byte) []byte {
			if header == "webhook-timestamp" {
				ts, _ := strconv.ParseInt(h.Get(header), 10, 64)
				h.Set(header, strconv.FormatInt(ts+1, 10))
			} else {
				h.Set(header, h.Get(header)+"x")
			}
			return body
		}
		r.mu.Unlock()
		_, err = conn.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now()`)
		require.NoError(t, err)
		require.NoError(t, d.Deliver(ctx))
	}
	good, bad = r.counts()
	require.Equal(t, 0, good)
	require.Equal(t, 3, bad)

	r.mu.Lock()
	r.tamper = nil
	r.mu.Unlock()
	_, err = conn.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now()`)
	require.NoError(t, err)
	require.NoError(t, d.Deliver(ctx))
	good, _ = r.counts()
	require.Equal(t, 1, good, "the untampered notification verifies")

	views, err := db.Notifications(ctx, "all", 0, 10)
	require.NoError(t, err)
	require.Len(t, views, 1)
	v := views[0]
	require.Equal(t, "delivered", v.Status)
	require.Len(t, v.Log, 4, "every attempt is in the delivery log")
	require.Equal(t, 200, v.Log[0].HTTPStatus, "newest first")
	for _, a := range v.Log[1:] {
		require.Equal(t, 401, a.HTTPStatus)
		require.Empty(t, a.ErrorClass)
		require.WithinDuration(t, time.Now(), a.At, time.Minute)
	}

	// Redelivery sends it again, once however often it is asked for.
	result, err := db.RedeliverNotification(ctx, v.ID, "alice @127.0.0.1")
	require.NoError(t, err)
	require.Equal(t, postgres.RedeliveryScheduled, result)
	result, err = db.RedeliverNotification(ctx, v.ID, "alice @127.0.0.1")
	require.NoError(t, err)
	require.Equal(t, postgres.RedeliveryAlreadyPending, result)
	require.NoError(t, d.Deliver(ctx))
	require.NoError(t, d.Deliver(ctx))
	good, _ = r.counts()
	require.Equal(t, 2, good)
	r.mu.Lock()
	require.Equal(t, r.good[0], r.good[1], "the same webhook-id: the receiver deduplicates")
	r.mu.Unlock()

	views, err = db.Notifications(ctx, "delivered", 0, 10)
	require.NoError(t, err)
	require.Len(t, views, 1)
	require.Equal(t, 1, views[0].Redeliveries)
	require.Equal(t, "alice @127.0.0.1", views[0].RedeliveryRequestedBy)
	require.NotNil(t, views[0].RedeliveryRequestedAt)
	require.Len(t, views[0].Log, 5)

	_, err = db.RedeliverNotification(ctx, 999999, "alice")
	require.ErrorContains(t, err, "not found")
	_, err = db.Notifications(ctx, "bogus", 0, 10)
	require.Error(t, err)
	pending, err := db.Notifications(ctx, "pending", 0, 10)
	require.NoError(t, err)
	require.Empty(t, pending)
}

func TestTransportErrorsAreClassifiedWithoutTheURL(t *testing.T) {
	db, conn, task := setup(t)
	ctx := context.Background()
	_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{Notify: true})
	require.NoError(t, err)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/hooks/SECRETPATH123"
	srv.Close() // refused
	var logged strings.Builder
	d := notify.New(db, url, testKey, zerolog.New(&syncWriter{w: &logged}), noAlerts{}, nil)
	require.NoError(t, d.Deliver(ctx))

	var lastError string
	require.NoError(t, conn.QueryRow(ctx, `SELECT last_error FROM notification_outbox`).Scan(&lastError))
	require.Equal(t, "not delivered: connection_refused", lastError)
	var class string
	require.NoError(t, conn.QueryRow(ctx, `SELECT error_class FROM notification_deliveries`).Scan(&class))
	require.Equal(t, notify.ClassConnectionRefused, class)
	require.NotContains(t, logged.String(), "SECRETPATH123")
	require.Contains(t, logged.String(), "connection_refused")

	// Timeouts: a receiver that never answers within the request bound.
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hang.Close()
	defer close(release)
	_, err = conn.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now()`)
	require.NoError(t, err)
	d = notify.New(db, hang.URL+"/hooks/SECRETPATH123", testKey, zerolog.New(io.Discard), noAlerts{}, nil)
	notify.SetRequestTimeout(d, 300*time.Millisecond)
	require.NoError(t, d.Deliver(ctx))
	require.NoError(t, conn.QueryRow(ctx, `SELECT error_class FROM notification_deliveries ORDER BY id DESC LIMIT 1`).Scan(&class))
	require.Equal(t, notify.ClassTimeout, class)
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
