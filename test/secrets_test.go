package test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

// Secret parts of the webhook URLs: a Slack-style URL's path is its
// credential, so it must never reach a log line or a table.
const (
	notifySecretPath = "hooks/NOTIFYSECRETPATH123"
	alertSecretPath  = "services/T0/B0/ALERTSECRETPATH456"
	notifySecret     = "e2e-notify-signing-secret-5f4e3d2c1b0a"
	rpcSecretPath    = "v2/RPCSECRETKEY321"
)

// brokenReceiver drops the connection on every request while failing is
// set (net/http's client then reports an error embedding the full URL),
// and otherwise answers 204 to a notification whose Standard Webhooks
// signature verifies.
type brokenReceiver struct {
	failing   atomic.Bool
	mu        sync.Mutex
	requests  map[string]int // path → requests seen
	delivered []string       // webhook-id of verified notifications
}

func (r *brokenReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.requests[req.URL.Path]++
	r.mu.Unlock()
	if r.failing.Load() {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	if req.URL.Path != "/"+notifySecretPath {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// Standard Webhooks, verified here independently of pkg/notify.
	id, ts := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp")
	mac := hmac.New(sha256.New, []byte(notifySecret))
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	unix, _ := strconv.ParseInt(ts, 10, 64)
	if req.Header.Get("webhook-signature") != want || time.Since(time.Unix(unix, 0)).Abs() > 5*time.Minute {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	r.mu.Lock()
	r.delivered = append(r.delivered, id)
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *brokenReceiver) seen(path string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[path]
}

func (r *brokenReceiver) deliveries() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.delivered...)
}

// TestNoSecretURLInLogsOrTables runs api, worker and scheduler with
// webhook URLs carrying secret paths at a receiver that drops every
// connection, makes both notifications and alerts fail there, then
// greps every process's output and every text column of every table for
// the secret paths (and for the whole DATABASE_URL and REDIS_URL).
func TestNoSecretURLInLogsOrTables(t *testing.T) {
	recv := &brokenReceiver{requests: map[string]int{}}
	recv.failing.Store(true)
	srv := httptest.NewServer(recv)
	defer srv.Close()

	s := harness.NewStack(t)
	s.Env["NOTIFY_WEBHOOK_URL"] = srv.URL + "/" + notifySecretPath + "?token=QUERYSECRET789"
	s.Env["NOTIFY_WEBHOOK_SECRET"] = notifySecret
	s.Env["ALERT_WEBHOOK_URL"] = srv.URL + "/" + alertSecretPath
	api := s.StartAPI(nil)
	// The worker checks deposits against an RPC endpoint whose path holds
	// the provider's key, at the same broken receiver.
	worker := s.StartWorker(map[string]string{
		"DEPOSIT_FINALITY": "finalized", "ETH_RPC_URL": srv.URL + "/" + rpcSecretPath, "ETH_RPC_TIMEOUT": "1s",
	})
	scheduler := s.StartScheduler(map[string]string{
		"NOTIFY_INTERVAL": "200ms", "HOT_PATH_CHECK_INTERVAL": "1s", "HEALTH_CHECK_INTERVAL": "1s",
	})
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)

	// A withdrawal that cannot be covered: failed, insufficient_funds, and
	// a notification for the user.
	status, body, err := client.Webhook(harness.Payment("secret-w1", "withdrawal", 1, "ETH", "5"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
	s.WaitFor("notification attempts", 60*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM notification_deliveries`) >= 2
	})
	// A deposit with a transaction hash: the chain check fails at the RPC.
	deposit := []byte(`{"event_id":"secret-d1","event_type":"deposit","user_id":1,"asset":"ETH","amount":"1","tx_hash":"0x` + strings.Repeat("ab", 32) + `"}`)
	status, body, err = client.Webhook(deposit)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
	s.WaitFor("the RPC called", 60*time.Second, func() bool { return recv.seen("/"+rpcSecretPath) > 0 })

	// A balance changed by hand: the scheduler's reconciliation alerts,
	// and the alert webhook fails the same way.
	_, err = s.DB.Exec(context.Background(), `UPDATE balances SET balance = balance + 1 WHERE user_id = 1`)
	require.NoError(t, err)
	s.WaitFor("an alert delivery failure logged", 60*time.Second, func() bool {
		return strings.Contains(scheduler.Logs(), "alert webhook delivery failed")
	})
	require.Positive(t, recv.seen("/"+notifySecretPath))
	require.Positive(t, recv.seen("/"+alertSecretPath))
	require.Contains(t, worker.Logs(), "notification not delivered")
	var lastError, class string
	require.NoError(t, s.DB.QueryRow(context.Background(), `SELECT last_error FROM notification_outbox`).Scan(&lastError))
	require.NoError(t, s.DB.QueryRow(context.Background(), `SELECT error_class FROM notification_deliveries LIMIT 1`).Scan(&class))
	require.Equal(t, "connection_closed", class)
	require.Equal(t, "not delivered: connection_closed", lastError)

	// settlectl and the admin endpoint see the same delivery log.
	out, code := s.Settlectl("notifications", "list", "--state", "pending")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "insufficient_funds:secret-w1")
	require.Contains(t, out, "connection_closed")
	out, code = s.Settlectl("notifications", "list", "--state", "bogus")
	require.NotEqual(t, 0, code, out)

	s.WaitFor("the RPC failure logged", 30*time.Second, func() bool { return strings.Contains(worker.Logs(), "127.0.0.1") && recv.seen("/"+rpcSecretPath) > 1 })
	secrets := []string{"NOTIFYSECRETPATH123", "ALERTSECRETPATH456", "QUERYSECRET789", "RPCSECRETKEY321", s.DatabaseURL, s.RedisURL}
	requireNoSecretInLogs(t, s, secrets)
	for _, p := range s.Procs {
		require.Contains(t, p.Logs(), `"level"`, "%s wrote logs", p.Name)
	}
	require.Contains(t, worker.Logs(), srv.Listener.Addr().String(), "the receiver's scheme and host are logged")
	scanTextColumns(t, s, secrets[:4])

	// The receiver recovers: the notification is delivered, signed, and a
	// redelivery through settlectl sends it once more.
	recv.failing.Store(false)
	_, err = s.DB.Exec(context.Background(), `UPDATE notification_outbox SET next_attempt_at = now()`)
	require.NoError(t, err)
	s.WaitFor("a verified delivery", 30*time.Second, func() bool { return len(recv.deliveries()) == 1 })
	s.WaitFor("the delivery recorded", 10*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM notification_outbox WHERE status = 'delivered'`) == 1
	})
	var id int64
	require.NoError(t, s.DB.QueryRow(context.Background(), `SELECT id FROM notification_outbox`).Scan(&id))
	out, code = s.Settlectl("notifications", "redeliver", fmt.Sprint(id), "--operator", "e2e")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "scheduled")
	s.WaitFor("the redelivery", 30*time.Second, func() bool { return len(recv.deliveries()) == 2 })
	require.Equal(t, []string{"insufficient_funds:secret-w1", "insufficient_funds:secret-w1"}, recv.deliveries())
	status, body, err = client.Admin(http.MethodGet, "/admin/notifications?state=all", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
	n := body["notifications"].([]any)[0].(map[string]any)
	require.Equal(t, float64(1), n["redeliveries"])
	require.Contains(t, n["redelivery_requested_by"], "e2e")
	requireNoSecretInLogs(t, s, secrets)
	scanTextColumns(t, s, secrets[:4])
}

// requireNoSecretInLogs fails on the first log line holding a secret.
func requireNoSecretInLogs(t *testing.T, s *harness.Stack, secrets []string) {
	t.Helper()
	for _, p := range s.Procs {
		for _, line := range strings.Split(p.Logs(), "\n") {
			for _, secret := range secrets {
				if strings.Contains(line, secret) {
					t.Fatalf("%s logged a secret: %s", p.Name, line)
				}
			}
		}
	}
}

// scanTextColumns looks for each secret in every text-like column of
// every table of the database.
func scanTextColumns(t *testing.T, s *harness.Stack, secrets []string) {
	t.Helper()
	ctx := context.Background()
	rows, err := s.DB.Query(ctx, `
		SELECT c.table_schema, c.table_name, c.column_name
		FROM information_schema.columns c
		JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE t.table_type = 'BASE TABLE'
		  AND c.table_schema NOT IN ('pg_catalog', 'information_schema')
		  AND c.data_type IN ('text', 'character varying', 'character', 'json', 'jsonb', 'ARRAY', 'USER-DEFINED')`)
	require.NoError(t, err)
	type column struct{ schema, table, name string }
	var columns []column
	for rows.Next() {
		var c column
		require.NoError(t, rows.Scan(&c.schema, &c.table, &c.name))
		columns = append(columns, c)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(columns), 20, "the scan sees the schema")
	for _, c := range columns {
		for _, secret := range secrets {
			var n int
			query := fmt.Sprintf(`SELECT count(*) FROM %q.%q WHERE %q::text LIKE '%%' || $1 || '%%'`, c.schema, c.table, c.name)
			require.NoError(t, s.DB.QueryRow(ctx, query, secret).Scan(&n), query)
			require.Zero(t, n, "%s.%s.%s holds %s", c.schema, c.table, c.name, secret)
		}
	}
}
