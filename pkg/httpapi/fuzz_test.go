package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// FuzzWebhookPayments feeds arbitrary bodies, correctly signed, through
// the real handler and real PostgreSQL. Whatever the body, the answer is
// never a 5xx, and a refused body never leaves a stored event. An accepted
// body's stored event round-trips: its content hash is the hash of the
// stored fields, and the stored event sent again as a body is the same
// content (a duplicate, not a conflict).
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
		storedRoundTrip(t, h, conn, answer.EventID, body)
	})
}

// storedRoundTrip re-encodes the stored event as a webhook body, checks
// the stored hash against the stored fields, and sends it again. sent is
// the body just answered 200: a post or void of an unknown hold is stored
// with amount 0, and its hash may hold the amount sent instead.
func storedRoundTrip(t *testing.T, h *harness, conn *pgx.Conn, eventID string, sent []byte) {
	t.Helper()
	ctx := context.Background()
	var (
		eventType, asset, amount, txHash, index string
		holdID, network, toAddress              string
		userID                                  int64
		hash                                    []byte
	)
	err := conn.QueryRow(ctx, `SELECT event_type, user_id, asset, amount::text, coalesce(tx_hash, ''), coalesce(transfer_index, ''), content_hash,
		coalesce(hold_id, ''), coalesce(network, ''), coalesce(to_address, '')
		FROM payment_events WHERE event_id = $1`, eventID).Scan(&eventType, &userID, &asset, &amount, &txHash, &index, &hash, &holdID, &network, &toAddress)
	if err != nil {
		t.Fatal(err)
	}
	value, err := decimal.NewFromString(amount)
	if err != nil {
		t.Fatalf("stored amount %q: %v", amount, err)
	}
	content := payment.Content{Type: payment.EventType(eventType), UserID: userID, Asset: asset, Amount: value, TxHash: txHash, TransferIndex: index,
		HoldID: holdID, Network: network, ToAddress: toAddress}
	again := map[string]any{"event_id": eventID, "event_type": eventType, "user_id": userID, "asset": asset, "amount": money.Canonical(value)}
	if value.IsZero() {
		// A post or void of a hold id that named no hold: stored with
		// amount 0, and sent again with the amount its hash holds.
		delete(again, "amount")
		if given, ok := sentAmount(sent); ok && holdID != "" && !bytes.Equal(content.Hash(), hash) {
			content.Amount = given
			again["amount"] = money.Canonical(given)
		}
	}
	if !bytes.Equal(content.Hash(), hash) {
		t.Fatalf("event %q: stored content_hash is not the hash of the stored fields %+v", eventID, content)
	}
	if txHash != "" {
		again["tx_hash"] = txHash
	}
	if index != "" {
		again["transfer_index"] = index
	}
	if holdID != "" {
		again["hold_id"] = holdID // a post or void takes the rest from its hold
	} else if network != "" {
		again["network"] = network
	}
	if toAddress != "" && holdID == "" {
		again["to_address"] = toAddress
	}
	body, err := json.Marshal(again)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/webhook/payments", bytes.NewReader(body))
	req.Header.Set(httpapi.HeaderSignature, sign(body))
	rec := httptest.NewRecorder()
	h.server.ServeHTTP(rec, req)
	var answer struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &answer)
	if rec.Code != http.StatusOK || answer.Status != "duplicate" {
		t.Fatalf("stored event %q re-encoded as %s: status %d %s, want a duplicate", eventID, body, rec.Code, rec.Body.Bytes())
	}
}

// sentAmount is the amount a body gave, if it gave one as a string.
func sentAmount(body []byte) (decimal.Decimal, bool) {
	var fields map[string]json.RawMessage
	var amount string
	if json.Unmarshal(body, &fields) != nil || json.Unmarshal(fields["amount"], &amount) != nil {
		return decimal.Decimal{}, false
	}
	d, err := decimal.NewFromString(amount)
	return d, err == nil
}

// FuzzDecodeStrict: what the plugins' admin bodies accept is one JSON
// object of known members, each once, and reads back the same when
// written again; anything else is refused without a panic.
func FuzzDecodeStrict(f *testing.F) {
	for _, seed := range []string{
		`{"reason":"refunded","operator":"ann"}`, `{"reason":"a","reason":"b"}`, `{"reason":"a"} {}`,
		`{"why":"x"}`, "{\"reason\":\"\xff\"}", `[]`, `{"reason":null}`, ``,
	} {
		f.Add([]byte(seed))
	}
	type decision struct {
		Reason   string `json:"reason"`
		Operator string `json:"operator"`
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var d decision
		if httpapi.DecodeStrict(body, &d) != nil {
			return
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil {
			t.Fatalf("accepted %q, which is no JSON object: %v", body, err)
		}
		for name := range members {
			if name != "reason" && name != "operator" {
				t.Fatalf("accepted %q with an unknown member %q", body, name)
			}
		}
		again, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var back decision
		if err := httpapi.DecodeStrict(again, &back); err != nil || back != d {
			t.Fatalf("%q read back as %+v (%v), not %+v", again, back, err, d)
		}
	})
}
