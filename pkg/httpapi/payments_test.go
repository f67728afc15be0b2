package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const txHash = "0x7A4A39DA2A3FA1FC2EF88FD1EAEA070286ED2ABA21E0419DCFB6D5C5D9F02A72"

// Row: new event stored as pending → 200 accepted.
func TestPaymentsAcceptedIsStoredPending(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	body := paymentBody(map[string]string{
		"event_id": `"evt-1"`, "event_type": `"deposit"`, "user_id": "7",
		"amount": `"50.10"`, "asset": `"USDC"`, "tx_hash": `"` + txHash + `"`,
	})
	r := h.postPayment(body, httpapi.HeaderRequestID, "trace-accepted-1")
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, map[string]any{"status": "accepted", "event_id": "evt-1", "trace_id": "trace-accepted-1"}, r.body)

	e, err := h.db.Event(context.Background(), "evt-1")
	require.NoError(t, err)
	require.Equal(t, payment.StatusPending, e.Status)
	require.Equal(t, payment.Deposit, e.Type)
	require.Equal(t, int64(7), e.UserID)
	require.Equal(t, "USDC", e.Asset)
	require.Equal(t, "50.1", e.Amount.String())
	require.Equal(t, strings.ToLower(txHash), e.TxHash, "tx hash stored lowercase")
	require.Equal(t, "trace-accepted-1", e.TraceID, "the trace id travels with the event")
	require.Equal(t, string(postgres.SourcePayments), e.Source)

	// The asset defaults to ETH; an event without tx_hash is fine.
	r = h.postPayment(deposit("evt-2", 7, "1"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	e, err = h.db.Event(context.Background(), "evt-2")
	require.NoError(t, err)
	require.Equal(t, "ETH", e.Asset)
	require.Empty(t, e.TxHash)

	// Every whitelisted type is accepted.
	for _, typ := range []string{"airdrop", "withdrawal", "withdrawal_fee"} {
		r := h.postPayment(paymentBody(map[string]string{"event_id": `"evt-` + typ + `"`, "event_type": `"` + typ + `"`, "user_id": "7", "amount": `"1"`}))
		require.Equal(t, http.StatusOK, r.status, "%s: %s", typ, r.raw)
	}
	require.Equal(t, 5.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "payments", "outcome": "accepted"}))
}

// Row: same event_id again with identical content → 200 duplicate. Key
// order, whitespace and the spelling of the amount do not matter.
func TestPaymentsIdenticalRedeliveryIsDuplicate(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	first := []byte(`{"event_id":"dup-1","event_type":"deposit","user_id":7,"amount":"50","asset":"ETH","tx_hash":"` + txHash + `"}`)
	require.Equal(t, http.StatusOK, h.postPayment(first).status)

	for _, again := range [][]byte{
		first,
		[]byte("{\n  \"amount\": \"50.000\",\n  \"user_id\": 7,\n  \"tx_hash\": \"" + strings.ToLower(txHash) + "\",\n  \"event_type\": \"deposit\",\n  \"event_id\": \"dup-1\"\n}"),
		[]byte(`{"event_id":"dup-1","event_type":"deposit","user_id":7,"amount":"5e1","tx_hash":"` + txHash + `"}`),
	} {
		r := h.postPayment(again)
		require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
		require.Equal(t, "duplicate", r.body["status"])
		require.Equal(t, "dup-1", r.body["event_id"])
		require.NotEmpty(t, r.body["trace_id"])
	}
	require.Equal(t, 1, h.countEvents())
}

// TestPaymentsTraceIndexStoredAsSent: a transfer_index is stored in its
// canonical spelling ("trace:call_0_1"); a deposit stored before that,
// as its sender spelt it, still meets its identical redelivery as a
// duplicate.
func TestPaymentsTraceIndexStoredAsSent(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	hash := strings.ToLower(txHash)
	_, err := h.db.InsertEvent(context.Background(), postgres.NewEvent{Event: payment.Event{ID: "trace-1", Type: payment.Deposit, UserID: 7,
		Asset: "ETH", Amount: decimal.RequireFromString("1"), TxHash: hash, TransferIndex: "trace:CALL_0_1", Network: payment.DefaultNetwork}})
	require.NoError(t, err)

	body := []byte(`{"event_id":"trace-1","event_type":"deposit","user_id":7,"amount":"1","tx_hash":"` + txHash + `","transfer_index":"trace:CALL_0_1"}`)
	r := h.postPayment(body)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "duplicate", r.body["status"])

	body = []byte(`{"event_id":"trace-2","event_type":"deposit","user_id":7,"amount":"1","tx_hash":"` + txHash + `","transfer_index":"trace:CALL_0_1"}`)
	require.Equal(t, "accepted", h.postPayment(body).body["status"])
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = 'trace-2' AND transfer_index = 'trace:call_0_1'`))
	require.Equal(t, "duplicate", h.postPayment(body).body["status"])
	body = []byte(`{"event_id":"trace-2","event_type":"deposit","user_id":7,"amount":"1","tx_hash":"` + txHash + `","transfer_index":"trace:call_0_2"}`)
	requireCode(t, h.postPayment(body), http.StatusConflict, httpapi.CodeConflict)
}

// Row: same event_id with different content → 409.
func TestPaymentsSameIDOtherContentIsConflict(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	h.createUser(8)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("c-1", 7, "50")).status)
	for name, body := range map[string][]byte{
		"amount":  deposit("c-1", 7, "50.000000000000000001"),
		"user":    deposit("c-1", 8, "50"),
		"type":    paymentBody(map[string]string{"event_id": `"c-1"`, "event_type": `"airdrop"`, "user_id": "7", "amount": `"50"`}),
		"asset":   paymentBody(map[string]string{"event_id": `"c-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"50"`, "asset": `"USDC"`}),
		"tx hash": paymentBody(map[string]string{"event_id": `"c-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"50"`, "tx_hash": `"` + txHash + `"`}),
	} {
		r := h.postPayment(body)
		requireError(t, r, http.StatusConflict)
		require.NotContains(t, string(r.raw), "c-1/", name)
	}
	e, err := h.db.Event(context.Background(), "c-1")
	require.NoError(t, err)
	require.Equal(t, "50", e.Amount.String(), "the stored event is untouched")
	require.Equal(t, 1, h.countEvents())
	require.Equal(t, 5.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"source": "payments", "outcome": "conflict"}))
}

// Row: missing or wrong signature → 401, checked before the body is read
// as JSON, and nothing is stored.
func TestPaymentsSignature(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	body := deposit("sig-1", 7, "1")
	post := func(headers map[string]string) response {
		headers["Content-Type"] = "application/json"
		return h.do(http.MethodPost, "/webhook/payments", body, headers)
	}
	requireError(t, post(map[string]string{}), http.StatusUnauthorized)
	requireError(t, post(map[string]string{httpapi.HeaderSignature: "00"}), http.StatusUnauthorized)
	requireError(t, post(map[string]string{httpapi.HeaderSignature: sign(append(body, ' '))}), http.StatusUnauthorized)
	requireError(t, post(map[string]string{httpapi.HeaderSignature: "sha256=" + sign(body)}), http.StatusUnauthorized)
	// A malformed body with a wrong signature is a 401, not a 400: the
	// signature comes first.
	r := h.do(http.MethodPost, "/webhook/payments", []byte("{not json"), map[string]string{httpapi.HeaderSignature: sign(body)})
	requireError(t, r, http.StatusUnauthorized)
	require.Equal(t, 0, h.countEvents())

	// Hex in either case, in either header.
	require.Equal(t, http.StatusOK, post(map[string]string{httpapi.HeaderSignature: strings.ToUpper(sign(body))}).status)
	require.Equal(t, http.StatusOK, post(map[string]string{httpapi.HeaderAlchemySignature: sign(body)}).status)
	require.Equal(t, 1, h.countEvents())
}

// Row: malformed JSON, missing field, amount not a string, invalid amount,
// unknown event_type or asset, unknown user → 400, nothing stored.
func TestPaymentsBadRequests(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	valid := map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1.5"`}
	with := func(k, v string) []byte {
		m := map[string]string{}
		for key, val := range valid {
			m[key] = val
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return paymentBody(m)
	}
	cases := map[string][]byte{
		"empty body":            {},
		"not json":              []byte(`{"event_id":`),
		"array":                 []byte(`[]`),
		"trailing data":         append(with("amount", `"1"`), []byte(` {}`)...),
		"duplicate field":       []byte(`{"event_id":"bad-1","event_type":"deposit","user_id":7,"amount":"1","amount":"2"}`),
		"invalid utf-8":         []byte("{\"event_id\":\"bad-\xff\",\"event_type\":\"deposit\",\"user_id\":7,\"amount\":\"1\"}"),
		"missing event_id":      with("event_id", ""),
		"missing event_type":    with("event_type", ""),
		"missing user_id":       with("user_id", ""),
		"missing amount":        with("amount", ""),
		"event_id empty":        with("event_id", `""`),
		"event_id too long":     with("event_id", `"`+strings.Repeat("x", 201)+`"`),
		"event_id a number":     with("event_id", `1`),
		"event_id control char": with("event_id", `"a\u0000b"`),
		"event_id reserved":     with("event_id", `"reorg:evt"`),
		"event_id give-back":    with("event_id", `"return:1:evt"`),
		"event_id alchemy":      with("event_id", `"alchemy:ETH_MAINNET:0x1:external"`),
		"event_id transfer":     with("event_id", `"chain:ETH_MAINNET:0x1:native"`),
		"amount a number":       with("amount", `1.5`),
		"amount an integer":     with("amount", `15`),
		"amount null":           with("amount", `null`),
		"amount zero":           with("amount", `"0"`),
		"amount negative":       with("amount", `"-1"`),
		"amount plus":           with("amount", `"+1"`),
		"amount spaces":         with("amount", `" 1"`),
		"amount underscore":     with("amount", `"1_000"`),
		"amount NaN":            with("amount", `"NaN"`),
		"amount Infinity":       with("amount", `"Infinity"`),
		"amount arabic digits":  with("amount", `"١٢"`),
		"amount 10^20":          with("amount", `"100000000000000000000"`),
		"amount too precise":    with("amount", `"0.0000000000000000001"`),
		"amount beyond USDC":    paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1.0000001"`, "asset": `"USDC"`}),
		"user_id a string":      with("user_id", `"7"`),
		"user_id a float":       with("user_id", `1.5`),
		"user_id 7.0":           with("user_id", `7.0`),
		"user_id exponent":      with("user_id", `7e0`),
		"user_id zero":          with("user_id", `0`),
		"user_id negative":      with("user_id", `-7`),
		"user_id overflow":      with("user_id", `99999999999999999999`),
		"unknown user":          with("user_id", `8`),
		"unknown event_type":    with("event_type", `"refund"`),
		"compensation not open": with("event_type", `"reorg_compensation"`),
		"event_type wrong case": with("event_type", `"Deposit"`),
		"unknown asset":         paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "asset": `"eth"`}),
		"asset a number":        paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "asset": `1`}),
		"tx_hash short":         paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "tx_hash": `"0x1234"`}),
		"tx_hash without 0x":    paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "tx_hash": `"` + txHash[2:] + `00"`}),
		"tx_hash not hex":       paymentBody(map[string]string{"event_id": `"bad-1"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "tx_hash": `"0x` + strings.Repeat("g", 64) + `"`}),
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			r := h.postPayment(body)
			requireError(t, r, http.StatusBadRequest)
			if strings.HasPrefix(name, "amount ") {
				// Whatever is wrong with it, even its JSON type: the
				// contract's code for an invalid amount.
				requireCode(t, r, http.StatusBadRequest, "invalid_amount")
			}
		})
	}
	require.Equal(t, 0, h.countEvents())

	// The boundaries that are valid.
	require.Equal(t, http.StatusOK, h.postPayment(with("event_id", `"`+strings.Repeat("é", 200)+`"`)).status)
	require.Equal(t, http.StatusOK, h.postPayment(paymentBody(map[string]string{"event_id": `"ok-2"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"99999999999999999999.999999999999999999"`})).status)
	require.Equal(t, http.StatusOK, h.postPayment(paymentBody(map[string]string{"event_id": `"ok-3"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"50.0000000000000000000"`})).status)
	require.Equal(t, http.StatusOK, h.postPayment(paymentBody(map[string]string{"event_id": `"ok-4"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "asset": "null", "tx_hash": "null", "extra": `{"ignored":true}`})).status)
	require.Equal(t, 4, h.countEvents())
}

// Row: body over 65,536 bytes → 413; exactly 65,536 is fine.
func TestPaymentsBodyOverLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	exact := deposit("big-1", 7, "1")
	exact = append(exact[:len(exact)-1], append(bytes.Repeat([]byte(" "), httpapi.PaymentsBodyMax-len(exact)), '}')...)
	require.Len(t, exact, httpapi.PaymentsBodyMax)
	require.Equal(t, http.StatusOK, h.postPayment(exact).status)

	over := append(bytes.Clone(exact[:len(exact)-1]), ' ', '}')
	require.Len(t, over, httpapi.PaymentsBodyMax+1)
	requireError(t, h.postPayment(over), http.StatusRequestEntityTooLarge)

	// Without a Content-Length (chunked), the limit still holds.
	req, err := http.NewRequest(http.MethodPost, h.url+"/webhook/payments", struct{ *bytes.Reader }{bytes.NewReader(over)})
	require.NoError(t, err)
	req.Header.Set(httpapi.HeaderSignature, sign(over))
	r := h.send(req)
	requireError(t, r, http.StatusRequestEntityTooLarge)
	require.Equal(t, 1, h.countEvents())
}

// Row: over the rate limit → 429 with Retry-After (here the verified
// deliveries' limit; the unverified one is in ratelimit_test.go).
func TestPaymentsOverRateLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.VerifiedRateLimit = mustRateLimit(t, "2/s,100/m")
	}})
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("rl-1", 7, "1")).status)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("rl-2", 7, "1")).status)
	r := h.postPayment(deposit("rl-3", 7, "1"))
	requireError(t, r, http.StatusTooManyRequests)
	require.Equal(t, "1", r.header.Get("Retry-After"), "the per-second window ends within a second")
	require.Equal(t, 2, h.countEvents())
}

// Row: PostgreSQL unreachable → 503 with Retry-After; nothing half
// stored, so the provider's retry brings the event again.
func TestPaymentsPostgresDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own PostgreSQL server")
	}
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
	require.NoError(t, err)
	t.Cleanup(pg.Close)
	dsn := pg.URL("postgres")
	migrator, err := postgres.Open(ctx, dsn, postgres.Options{ConnsMax: 2})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx)
	require.NoError(t, err)
	migrator.Close()

	h := newHarness(t, harnessOptions{dsn: dsn})
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(deposit("up-1", 7, "1")).status)

	pg.Stop()
	r := h.postPayment(deposit("down-1", 7, "2"))
	requireError(t, r, http.StatusServiceUnavailable)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.NotContains(t, string(r.raw), "127.0.0.1", "internal error text never reaches the caller")
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total", map[string]string{"outcome": "rejected", "reason": "unavailable"}))
	ready := h.do(http.MethodGet, "/readyz", nil, nil)
	requireError(t, ready, http.StatusServiceUnavailable)

	require.NoError(t, pg.Start(ctx))
	_, err = h.db.Event(ctx, "down-1")
	require.ErrorIs(t, err, payment.ErrNotFound, "nothing of the refused event was stored")
	require.Equal(t, 1, h.countEvents())

	r = h.postPayment(deposit("down-1", 7, "2"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "accepted", r.body["status"], "the retry stores it")

	// A statement that cannot finish (here: waiting on a lock another
	// session holds) times out into the same 503.
	locker, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer locker.Close(ctx)
	lock, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, "LOCK TABLE payment_events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	r = h.postPayment(deposit("stalled-1", 7, "3"))
	require.NoError(t, lock.Rollback(ctx))
	requireError(t, r, http.StatusServiceUnavailable)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	// The statement may have reached the server before the timeout and
	// committed once it resumed: then it is whole, and the provider's
	// retry is a duplicate of it; either way nothing is half stored.
	r = h.postPayment(deposit("stalled-1", 7, "3"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Contains(t, []any{"accepted", "duplicate"}, r.body["status"])
	e, err := h.db.Event(ctx, "stalled-1")
	require.NoError(t, err)
	require.Equal(t, "3", e.Amount.String())
	require.Equal(t, 1, countRows(t, dsn, "SELECT count(*) FROM payment_events WHERE event_id = 'stalled-1'"))
}

// 20 concurrent identical deliveries: all answered 200, one row.
func TestPaymentsConcurrentIdenticalDeliveries(t *testing.T) {
	const deliveries = 20
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	body := deposit("race-1", 7, "12.5")
	statuses := make([]string, deliveries)
	codes := make([]int, deliveries)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, err := http.NewRequest(http.MethodPost, h.url+"/webhook/payments", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set(httpapi.HeaderSignature, sign(body))
			// A fresh transport per delivery: separate connections, as
			// from a provider retrying.
			client := &http.Client{Timeout: requestTimeout, Transport: &http.Transport{}}
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			codes[i] = resp.StatusCode
			var answer struct{ Status string }
			if decodeErr := jsonDecode(resp, &answer); decodeErr == nil {
				statuses[i] = answer.Status
			}
		}()
	}
	close(start)
	wg.Wait()
	accepted := 0
	for i := range deliveries {
		require.Equal(t, http.StatusOK, codes[i], "delivery %d", i)
		require.Contains(t, []string{"accepted", "duplicate"}, statuses[i])
		if statuses[i] == "accepted" {
			accepted++
		}
	}
	require.Equal(t, 1, accepted, "exactly one delivery stored it")
	require.Equal(t, 1, h.countEvents())
	require.Equal(t, 1, countRows(t, h.dsn, "SELECT count(*) FROM payment_events WHERE event_id = $1", "race-1"))
}

func mustRateLimit(t testing.TB, s string) httpapi.RateLimit {
	t.Helper()
	l, err := httpapi.ParseRateLimit(s)
	require.NoError(t, err)
	return l
}

func TestPaymentsDepositIDsAreNotShared(t *testing.T) {
	// A caller cannot occupy the id of a compensation or an Alchemy
	// deposit (the prefixes are reserved), so the ids settle derives are
	// always free for settle.
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	for _, id := range []string{payment.CompensationEventID("x"), "alchemy:ETH_MAINNET:" + strings.ToLower(txHash) + ":external",
		payment.Transfer{Network: "ETH_MAINNET", TxHash: strings.ToLower(txHash), Index: payment.TransferNative}.EventID()} {
		requireError(t, h.postPayment(deposit(id, 7, "1")), http.StatusBadRequest)
	}
	require.Equal(t, 0, h.countEvents())
}
