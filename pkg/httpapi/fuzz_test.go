package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/httpapi"
)

// FuzzWebhookPayments feeds arbitrary bodies, correctly signed, through
// the real handler and real PostgreSQL. Whatever the body, the answer is
// never a 5xx, and a refused body never leaves a stored event.
func FuzzWebhookPayments(f *testing.F) {
	for _, seed := range []string{
		`{"event_id":"f-1","event_type":"deposit","user_id":7,"amount":"50.5"}`,
		`{"event_id":"f-2","event_type":"withdrawal","user_id":7,"amount":"1e-3","asset":"USDC","tx_hash":"0x7a4a39da2a3fa1fc2ef88fd1eaea070286ed2aba21e0419dcfb6d5c5d9f02a72"}`,
		`{"event_id":"f-3","event_type":"deposit","user_id":7,"amount":50.5}`,
		`{"event_id":"f-4","event_type":"deposit","user_id":"7","amount":"1"}`,
		`{"event_id":"f-5","event_type":"deposit","user_id":7,"amount":"1","amount":"2"}`,
		`{"event_id":"reorg:f-6","event_type":"deposit","user_id":7,"amount":"1"}`,
		`{"event_id":"f-7","event_type":"deposit","user_id":9223372036854775807,"amount":"99999999999999999999.999999999999999999"}`,
		`{"event_id":"f-8","event_type":"deposit","user_id":7,"amount":"1","asset":"\u0000"}`,
		`{"event_id":"\ud800","event_type":"deposit","user_id":7,"amount":"1"}`,
		`[1,2,3]`,
		`{"event_id":`,
		``,
	} {
		f.Add([]byte(seed))
	}
	h := newHarness(f, harnessOptions{})
	h.createUser(7)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = conn.Close(ctx) })
	count := func(t *testing.T) int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM payment_events").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		before := count(t)
		req := httptest.NewRequest(http.MethodPost, "/webhook/payments", bytes.NewReader(body))
		req.Header.Set(httpapi.HeaderSignature, sign(body))
		rec := httptest.NewRecorder()
		h.server.ServeHTTP(rec, req)
		if rec.Code >= http.StatusInternalServerError {
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.Bytes())
		}
		after := count(t)
		if rec.Code != http.StatusOK {
			if after != before {
				t.Fatalf("status %d for %q, yet %d events were stored", rec.Code, body, after-before)
			}
			var answer struct {
				Error   string `json:"error"`
				TraceID string `json:"trace_id"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil || answer.Error == "" || answer.TraceID == "" {
				t.Fatalf("status %d without a JSON error: %s", rec.Code, rec.Body.Bytes())
			}
			return
		}
		var answer struct {
			Status  string `json:"status"`
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
			t.Fatalf("200 without JSON: %s", rec.Body.Bytes())
		}
		var stored int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM payment_events WHERE event_id = $1", answer.EventID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != 1 || (answer.Status == "accepted") != (after == before+1) {
			t.Fatalf("answer %+v, %d stored with that id, %d → %d events", answer, stored, before, after)
		}
	})
}
