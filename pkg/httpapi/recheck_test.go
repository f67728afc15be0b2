package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// recordingChain answers every recheck with one result and remembers who
// asked. The handler's mapping is what is tested here; the recheck itself
// runs against a real chain in test/recheck_test.go. It has an RPC on
// every network but those in noRPC.
type recordingChain struct {
	mu     sync.Mutex
	answer postgres.Recheck
	err    error
	asked  []string
	noRPC  map[string]bool
}

func (c *recordingChain) HasRPC(network string) bool { return !c.noRPC[network] }

func (c *recordingChain) Recheck(_ context.Context, eventID, who string) (postgres.Recheck, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, eventID+" by "+who)
	r := c.answer
	r.EventID, r.RequestedBy = eventID, who
	return r, c.err
}

func recheckPath(id string) string { return "/admin/events/" + id + "/recheck" }

// Without an RPC the api cannot recheck: an unknown event is a 404 all
// the same, a known one a 409 saying what is missing.
func TestRecheckWithoutRPCSaysSo(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.do(http.MethodPost, recheckPath("dep-1"), nil, nil)
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	r = h.do(http.MethodPost, recheckPath("dep-1"), nil, bearer(apiToken))
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	r = h.do(http.MethodPost, recheckPath("dep-1"), nil, bearer(adminToken))
	requireCode(t, r, http.StatusNotFound, httpapi.CodeNotFound)
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("dep-1", 7, "1")).status)
	r = h.do(http.MethodPost, recheckPath("dep-1"), nil, bearer(adminToken))
	requireCode(t, r, http.StatusConflict, httpapi.CodeConflict)
	require.Contains(t, r.body["error"], "ETH_RPC_URL")
}

func TestRecheckAnswers(t *testing.T) {
	chain := &recordingChain{answer: postgres.Recheck{ID: 4, ChainState: "mismatch", Result: postgres.RecheckUnchanged,
		Detail: "the transaction carries 2 base units", Status: payment.StatusFailed, CreatedAt: time.Now()}}
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Chain = chain }})

	r := h.do(http.MethodPost, recheckPath("dep-1"), []byte(`{"operator":"alice"}`), bearer(adminToken))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "unchanged", r.body["result"])
	require.Equal(t, "mismatch", r.body["chain_state"])
	require.Equal(t, "failed", r.body["status"])
	require.Equal(t, "the transaction carries 2 base units", r.body["detail"])
	require.Equal(t, 4.0, r.body["recheck_id"])
	require.Equal(t, "alice @127.0.0.1", r.body["requested_by"], "who, and from where")
	require.NotEmpty(t, r.body["trace_id"])

	r = h.do(http.MethodPost, recheckPath("dep%2F2"), nil, bearer(adminToken))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "admin-api @127.0.0.1", r.body["requested_by"], "no name given")
	require.Equal(t, "dep/2 by admin-api @127.0.0.1", chain.asked[1], "an escaped slash is part of the id")

	for _, body := range []string{`{"operator":7}`, `{"who":"x"}`, `[`, `{"operator":"` + strings.Repeat("a", 201) + `"}`, `{"operator":"a\u0007"}`} {
		r = h.do(http.MethodPost, recheckPath("dep-1"), []byte(body), bearer(adminToken))
		requireCode(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest)
	}
	require.Len(t, chain.asked, 2, "a refused body asks nothing")

	chain.err = payment.ErrNotFound
	r = h.do(http.MethodPost, recheckPath("nobody"), nil, bearer(adminToken))
	requireCode(t, r, http.StatusNotFound, httpapi.CodeNotFound)

	chain.err = payment.Unavailable("eth_getTransactionReceipt", context.DeadlineExceeded)
	r = h.do(http.MethodPost, recheckPath("dep-1"), nil, bearer(adminToken))
	requireCode(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	require.Contains(t, r.body["error"], "recorded")
	require.NotEmpty(t, r.header.Get("Retry-After"))
}

// TestAlchemyReportedAgainReopens: without an RPC the provider's word is
// the evidence both ways: a removed log voids its deposit, the same
// transfer reported again reopens it (once), as a new generation.
func TestAlchemyReportedAgainReopens(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	ctx := context.Background()
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	r := h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
	before, err := h.db.Event(ctx, id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, before.Status)

	r = h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 0.0, r.body["accepted"])
	require.Equal(t, 1.0, r.body["duplicates"], "already an event")
	require.Equal(t, 1.0, r.body["reopened"])
	after, err := h.db.Event(ctx, id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusPending, after.Status)
	require.Empty(t, after.Outcome)
	require.Equal(t, before.Generation+1, after.Generation)

	r = h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, 1.0, r.body["duplicates"])
	require.Equal(t, 0.0, r.body["reopened"], "a pending deposit is not reopened again")
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "alchemy", "outcome": "reopened"}))
	require.Equal(t, 1, h.countEvents())
}

// TestAlchemyRemovedWithRPCAsksTheChain: with an RPC a removed log
// reverses nothing; a deposit waiting for finality is due at once.
func TestAlchemyRemovedWithRPCAsksTheChain(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Chain = &recordingChain{} }})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	r := h.postAlchemy(tokenPayload(t, "0x1", false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 0.0, r.body["reversed"])
	require.Equal(t, 1.0, r.body["rechecked"], "pending: the gate asks the chain anyway")
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'pending'`, id))

	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'enqueued' WHERE event_id = $1`, id)
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'awaiting_finality', next_check_at = now() + interval '1 hour' WHERE event_id = $1`, id)
	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, 1.0, r.body["rechecked"], "%s", r.raw)
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'awaiting_finality' AND next_check_at <= now()`, id),
		"due at once, still waiting: the chain decides")

	// Credited before finality: the reorg watcher decides.
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'enqueued' WHERE event_id = $1`, id)
	execSQL(t, h.dsn, `INSERT INTO chain_transfers (network, tx_hash, transfer_index, event_id, asset)
		SELECT network, tx_hash, '1', event_id, asset FROM payment_events WHERE event_id = $1`, id) // a credit holds its claim (0027)
	execSQL(t, h.dsn, `UPDATE payment_events SET status = 'confirmed', outcome = 'success', chain_state = 'watching' WHERE event_id = $1`, id)
	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, 1.0, r.body["rechecked"], "%s", r.raw)
	// Credited and final: the report does not outrank the chain.
	execSQL(t, h.dsn, `UPDATE payment_events SET chain_state = 'final' WHERE event_id = $1`, id)
	r = h.postAlchemy(tokenPayload(t, "0x1", true), alchemyKey)
	require.Equal(t, 0.0, r.body["rechecked"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["ignored"])
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "alchemy", "reason": "removed_final"}))
	require.Zero(t, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_type = 'reorg_compensation'`), "nothing reversed by the flag")
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'confirmed'`, id))

	r = h.postAlchemy(tokenPayload(t, "0x2", true), alchemyKey)
	require.Equal(t, 1.0, r.body["ignored"], "removal of a deposit never stored")
	require.Equal(t, 3.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "alchemy", "outcome": "rechecked"}))
}

// baseUSDC is USDC's contract on BASE_MAINNET.
const baseUSDC = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"

func baseTokenPayload(t *testing.T, removed bool) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"webhookId": "wh_1", "id": "whevt_1", "type": "ADDRESS_ACTIVITY",
		"event": map[string]any{
			"network": "BASE_MAINNET",
			"activity": []any{map[string]any{
				"hash": alchemyTx, "toAddress": alchemyRecipient, "category": "token", "value": 1.5, "asset": "USDC",
				"rawContract": map[string]any{"rawValue": "0x16e360", "address": baseUSDC, "decimals": 6},
				"log":         map[string]any{"address": baseUSDC, "logIndex": "0x1", "removed": removed},
			}},
		},
	})
	require.NoError(t, err)
	return body
}

// TestAlchemyRemovedOnNetworkWithoutRPCReverses: RPCs are per network
// (RPC_URL_<NETWORK>). With one on ETH_MAINNET and none on BASE_MAINNET
// (policy none there), a removed log on BASE_MAINNET is the evidence
// itself and reverses its deposit; a recheck would ask nobody and the
// worker would credit it unchecked.
func TestAlchemyRemovedOnNetworkWithoutRPCReverses(t *testing.T) {
	chain := &recordingChain{noRPC: map[string]bool{"BASE_MAINNET": true}}
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.Chain = chain
		o.Networks = []string{"ETH_MAINNET", "BASE_MAINNET"}
	}})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "BASE_MAINNET", alchemyRecipient).status)
	id := "chain:BASE_MAINNET:" + alchemyTx + ":1"

	r := h.postAlchemy(baseTokenPayload(t, false), alchemyKey)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = h.postAlchemy(baseTokenPayload(t, true), alchemyKey)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["reversed"], "BASE_MAINNET has no RPC: the flag is the evidence; answer %s", r.raw)
	e, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status)
	require.Equal(t, string(payment.OutcomeReorged), e.Outcome)
}

// FuzzRecheckBody feeds arbitrary bodies to the recheck route: never a
// 5xx, and whoever is recorded is a printable, bounded name.
func FuzzRecheckBody(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"operator":"alice"}`, `{"operator":""}`, `{"operator":null}`, `{"operator":"\u0000"}`,
		`{"operator":"a","operator":"b"}`, `{"x":1}`, `[]`, `{"operator":"` + strings.Repeat("é", 200) + `"}`} {
		f.Add([]byte(seed))
	}
	chain := &recordingChain{answer: postgres.Recheck{Result: postgres.RecheckNotApplicable, ChainState: "not_asked"}}
	h := newHarness(f, harnessOptions{change: func(o *httpapi.Options) { o.Chain = chain }})
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, recheckPath("dep-1"), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		rec := httptest.NewRecorder()
		h.server.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var answer struct {
				RequestedBy string `json:"requested_by"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
			name, _, ok := strings.Cut(answer.RequestedBy, " @")
			require.True(t, ok, answer.RequestedBy)
			require.NotEmpty(t, strings.TrimSpace(name))
			require.LessOrEqual(t, utf8.RuneCountInString(name), 200)
			require.True(t, utf8.ValidString(name))
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.Bytes())
		}
	})
}

// downQueue is the api's real recheck queue on a Redis that is down:
// nothing listens on its port.
func downQueue(t *testing.T) *outbox.RecheckQueue {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), DialTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return outbox.NewRecheckQueue(rdb)
}

// An api without an RPC hands a recheck to the workers only on a network
// one of them reported an RPC on (else 409, as before); when it cannot
// hand it over, 503 and nothing recorded. The hand-over itself runs with
// a real worker in test/recheck_test.go.
func TestRecheckHandOverWithoutRPC(t *testing.T) {
	for _, c := range []struct {
		reported string
		status   int
		code     string
		says     string
	}{
		{"BASE_MAINNET", http.StatusConflict, httpapi.CodeConflict, "no worker reported an RPC"},
		{"ETH_MAINNET", http.StatusServiceUnavailable, httpapi.CodeUnavailable, "cannot hand the recheck to the workers"},
	} {
		queue := downQueue(t)
		h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Rechecks = queue }})
		execSQL(t, h.dsn, `INSERT INTO network_rpc_reports (network, reported_at) VALUES ($1, now())`, c.reported)
		h.createUser(7)
		require.Equal(t, http.StatusOK, h.postPayment(deposit("dep-1", 7, "1")).status)
		r := h.do(http.MethodPost, recheckPath("dep-1"), nil, bearer(adminToken))
		requireCode(t, r, c.status, c.code)
		require.Contains(t, r.body["error"], c.says)
		require.Equal(t, 0, countRows(t, h.dsn, "SELECT count(*) FROM event_rechecks"))
	}
}
