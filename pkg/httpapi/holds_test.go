package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const holdRecipient = "0x00000000000000000000000000000000000000AB"

func holdBody(id string, user int64, amount string, extra map[string]string) []byte {
	fields := map[string]string{"event_id": fmt.Sprintf("%q", id), "event_type": `"withdrawal_hold"`,
		"user_id": fmt.Sprint(user), "amount": fmt.Sprintf("%q", amount)}
	for k, v := range extra {
		fields[k] = v
	}
	return paymentBody(fields)
}

func resolveBody(id, typ string, user int64, holdID string, extra map[string]string) []byte {
	fields := map[string]string{"event_id": fmt.Sprintf("%q", id), "event_type": fmt.Sprintf("%q", typ),
		"user_id": fmt.Sprint(user), "hold_id": fmt.Sprintf("%q", holdID)}
	for k, v := range extra {
		fields[k] = v
	}
	return paymentBody(fields)
}

// settleAll claims every pending event and applies it, as the pipeline
// would.
func (h *harness) settleAll() {
	h.t.Helper()
	ctx := context.Background()
	claimed, err := h.db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(h.t, err)
	for _, c := range claimed {
		_, err := h.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{})
		require.NoError(h.t, err)
	}
}

func TestHoldWebhookStoresItsFields(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	r := h.postPayment(holdBody("h-1", 7, "1.5", map[string]string{"to_address": `"` + holdRecipient + `"`}))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "accepted", r.body["status"])
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = 'h-1'
		AND event_type = 'withdrawal_hold' AND network = 'ETH_MAINNET' AND to_address = '0x00000000000000000000000000000000000000ab'`))
	// The same hold again (address in another case, network spelled out)
	// is a duplicate; another recipient is a conflict.
	r = h.postPayment(holdBody("h-1", 7, "1.50", map[string]string{"to_address": `"0x00000000000000000000000000000000000000ab"`, "network": `"ETH_MAINNET"`}))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "duplicate", r.body["status"])
	r = h.postPayment(holdBody("h-1", 7, "1.5", map[string]string{"to_address": `"0x00000000000000000000000000000000000000ac"`}))
	requireCode(t, r, http.StatusConflict, "conflict")
	r = h.postPayment(holdBody("h-1", 7, "1.5", nil))
	requireCode(t, r, http.StatusConflict, "conflict")
}

func TestHoldWebhookBadRequests(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(holdBody("h-1", 7, "10", nil)).status)
	for name, body := range map[string][]byte{
		"unknown network":       holdBody("x1", 7, "1", map[string]string{"network": `"BASE_MAINNET"`}),
		"malformed network":     holdBody("x2", 7, "1", map[string]string{"network": `"eth"`}),
		"network not a string":  holdBody("x3", 7, "1", map[string]string{"network": `1`}),
		"bad to_address":        holdBody("x4", 7, "1", map[string]string{"to_address": `"0x12"`}),
		"to_address not string": holdBody("x5", 7, "1", map[string]string{"to_address": `12`}),
		"hold with tx_hash":     holdBody("x6", 7, "1", map[string]string{"tx_hash": `"` + txHash + `"`}),
		"hold without amount":   paymentBody(map[string]string{"event_id": `"x7"`, "event_type": `"withdrawal_hold"`, "user_id": "7"}),
		"hold_id on a deposit":  paymentBody(map[string]string{"event_id": `"x8"`, "event_type": `"deposit"`, "user_id": "7", "amount": `"1"`, "hold_id": `"h-1"`}),
		"post without hold_id":  paymentBody(map[string]string{"event_id": `"x9"`, "event_type": `"withdrawal_post"`, "user_id": "7"}),
		"hold_id not a string":  resolveBody("x10", "withdrawal_post", 7, "h-1", map[string]string{"hold_id": `7`}),
		"empty hold_id":         resolveBody("x11", "withdrawal_post", 7, "", nil),
		"void with tx_hash":     resolveBody("x13", "withdrawal_void", 7, "h-1", map[string]string{"tx_hash": `"` + txHash + `"`}),
	} {
		r := h.postPayment(body)
		requireCode(t, r, http.StatusBadRequest, "invalid_request")
		_ = name
	}
	// An amount given on a post must be the hold's, and a string.
	r := h.postPayment(resolveBody("x15", "withdrawal_post", 7, "h-1", map[string]string{"amount": `"9"`}))
	requireCode(t, r, http.StatusBadRequest, "invalid_amount")
	r = h.postPayment(resolveBody("x14", "withdrawal_post", 7, "h-1", map[string]string{"amount": `10`}))
	requireCode(t, r, http.StatusBadRequest, "invalid_amount")
	require.Equal(t, 1, h.countEvents(), "nothing refused was stored")
}

func TestPostTakesItsHoldsFacts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	h.createUser(8)
	execSQL(t, h.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'USDC', 100, 100)`)
	require.Equal(t, http.StatusOK, h.postPayment(holdBody("h-1", 7, "25", map[string]string{"asset": `"USDC"`, "to_address": `"` + holdRecipient + `"`})).status)

	// Without an amount, with it ("25.0" is 25): one event, a duplicate.
	r := h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", map[string]string{"tx_hash": `"` + txHash + `"`}))
	require.Equal(t, "accepted", r.body["status"], "%s", r.raw)
	r = h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", map[string]string{"tx_hash": `"` + txHash + `"`, "amount": `"25.0"`}))
	require.Equal(t, "duplicate", r.body["status"], "%s", r.raw)
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id = 'p-1' AND hold_id = 'h-1'
		AND asset = 'USDC' AND amount = 25 AND to_address = '0x00000000000000000000000000000000000000ab'`))
	// Another user's post is accepted and fails in the ledger, whatever
	// amount it names: it learns nothing of the hold.
	r = h.postPayment(resolveBody("p-2", "withdrawal_void", 8, "h-1", map[string]string{"amount": `"1"`}))
	require.Equal(t, "accepted", r.body["status"], "%s", r.raw)
}

func TestHoldReadsAndBalances(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	execSQL(t, h.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'ETH', 100, 100)`)
	requireCode(t, h.do(http.MethodGet, "/v1/holds/h-1", nil, bearer(apiToken)), http.StatusNotFound, "not_found")
	require.Equal(t, http.StatusUnauthorized, h.do(http.MethodGet, "/v1/holds/h-1", nil, nil).status)

	require.Equal(t, http.StatusOK, h.postPayment(holdBody("h-1", 7, "30", map[string]string{"to_address": `"` + holdRecipient + `"`})).status)
	h.settleAll()
	r := h.do(http.MethodGet, "/v1/holds/h-1", nil, bearer(apiToken))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, "h-1", r.body["hold_id"])
	require.Equal(t, float64(7), r.body["user_id"])
	require.Equal(t, "ETH", r.body["asset"])
	require.Equal(t, "30", r.body["amount"])
	require.Equal(t, "ETH_MAINNET", r.body["network"])
	require.Equal(t, "0x00000000000000000000000000000000000000ab", r.body["to_address"])
	require.Equal(t, "open", r.body["status"])
	require.NotEmpty(t, r.body["created_at"])
	require.Nil(t, r.body["resolved_at"])
	require.Nil(t, r.body["resolved_by"])

	r = h.do(http.MethodGet, "/v1/users/7/balances", nil, bearer(apiToken))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, []any{map[string]any{"asset": "ETH", "balance": "100", "held": "30", "available": "70"}}, r.body["balances"])

	require.Equal(t, http.StatusOK, h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", nil)).status)
	h.settleAll()
	r = h.do(http.MethodGet, "/v1/holds/h-1", nil, bearer(apiToken))
	require.Equal(t, "posted", r.body["status"])
	require.Equal(t, "p-1", r.body["resolved_by"])
	require.NotNil(t, r.body["resolved_at"])
	e, err := h.db.Event(context.Background(), "p-1")
	require.NoError(t, err)
	require.Equal(t, payment.StatusConfirmed, e.Status)
	r = h.do(http.MethodGet, "/v1/users/7/balances", nil, bearer(apiToken))
	require.Equal(t, []any{map[string]any{"asset": "ETH", "balance": "70", "held": "0", "available": "70"}}, r.body["balances"])
}

// TestPostHoldLookupUnavailable: the read of a post's hold that cannot
// finish answers 503, and nothing is stored.
func TestPostHoldLookupUnavailable(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	require.Equal(t, http.StatusOK, h.postPayment(holdBody("h-1", 7, "10", nil)).status)
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, h.dsn)
	require.NoError(t, err)
	defer locker.Close(ctx)
	lock, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, "LOCK TABLE payment_events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	r := h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", nil))
	require.NoError(t, lock.Rollback(ctx))
	requireCode(t, r, http.StatusServiceUnavailable, "unavailable")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, 1, h.countEvents())
	require.Equal(t, "accepted", h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", nil)).body["status"])
}

// TestResolveRedeliveredAfterItsHoldIsADuplicate: a post or void that
// arrives before its hold is stored as its sender wrote it; once the hold
// exists, the same bytes are filled in from the hold, yet they are the
// same delivery (200 duplicate), in either order. Other content is still
// a conflict.
func TestResolveRedeliveredAfterItsHoldIsADuplicate(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	post := resolveBody("p-1", "withdrawal_post", 7, "h-1", nil)
	void := resolveBody("v-1", "withdrawal_void", 7, "h-1", map[string]string{"amount": `"1.5"`})
	for _, body := range [][]byte{post, void} {
		r := h.postPayment(body)
		require.Equal(t, "accepted", r.body["status"], "%s", r.raw)
	}

	r := h.postPayment(holdBody("h-1", 7, "1.5", map[string]string{"asset": `"USDC"`}))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)

	for _, body := range [][]byte{post, void} {
		r = h.postPayment(body) // the very same bytes
		require.Equal(t, http.StatusOK, r.status, "identical redelivery: %s", r.raw)
		require.Equal(t, "duplicate", r.body["status"])
	}
	r = h.postPayment(resolveBody("p-1", "withdrawal_post", 7, "h-1", map[string]string{"tx_hash": `"` + txHash + `"`}))
	requireCode(t, r, http.StatusConflict, httpapi.CodeConflict)
	r = h.postPayment(resolveBody("v-1", "withdrawal_void", 7, "h-1", map[string]string{"amount": `"2"`}))
	require.Equal(t, http.StatusBadRequest, r.status, "not the hold's amount: %s", r.raw)

	// Sent after the hold: stored filled in, its redelivery as before.
	after := resolveBody("p-2", "withdrawal_post", 7, "h-1", nil)
	require.Equal(t, "accepted", h.postPayment(after).body["status"])
	require.Equal(t, "duplicate", h.postPayment(after).body["status"])
}

// TestPostBeforeItsHoldIsUnknownForGood: a post whose hold id named no
// hold when it was accepted ends unknown_hold even once a hold of that id
// has arrived and been applied, with or without an amount of its own: it
// is stored with amount 0, the ledger's mark for it.
func TestPostBeforeItsHoldIsUnknownForGood(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	execSQL(t, h.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'ETH', 100, 100)`)
	ctx := context.Background()
	for _, body := range [][]byte{
		resolveBody("p-early", "withdrawal_post", 7, "h-late", map[string]string{"amount": `"30"`}),
		resolveBody("v-early", "withdrawal_void", 7, "h-late", map[string]string{"amount": `"30"`}),
		resolveBody("p-bare", "withdrawal_post", 7, "h-late", nil),
	} {
		r := h.postPayment(body)
		require.Equal(t, "accepted", r.body["status"], "%s", r.raw)
	}
	require.Equal(t, 3, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE hold_id = 'h-late' AND amount = 0`))
	// Still checked as an amount: a 400 as before.
	requireCode(t, h.postPayment(resolveBody("p-bad", "withdrawal_post", 7, "h-late", map[string]string{"amount": `"0.1234567890123456789"`})),
		http.StatusBadRequest, httpapi.CodeInvalidAmount)
	require.Equal(t, "accepted", h.postPayment(holdBody("h-late", 7, "30", nil)).body["status"])

	claimed, err := h.db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	// The hold first, as if the posts' tasks ran late.
	slices.SortStableFunc(claimed, func(a, b postgres.Claimed) int {
		return holdFirst(a) - holdFirst(b)
	})
	require.Equal(t, "h-late", claimed[0].Event.ID)
	for _, c := range claimed {
		_, err := h.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{})
		require.NoError(t, err)
	}
	for _, id := range []string{"p-early", "v-early", "p-bare"} {
		e, err := h.db.Event(ctx, id)
		require.NoError(t, err)
		require.Equal(t, payment.StatusFailed, e.Status, id)
		require.Equal(t, string(payment.OutcomeUnknownHold), e.Outcome, id)
	}
	r := h.do(http.MethodGet, "/v1/users/7/balances", nil, bearer(apiToken))
	require.Equal(t, []any{map[string]any{"asset": "ETH", "balance": "100", "held": "30", "available": "70"}}, r.body["balances"], "the hold stays open")
}

// TestPostOfNoHoldKeepsItsAmount: a post or void accepted while its hold
// id named no hold is stored with amount 0, but the amount it gave is
// part of its content: the same id with another amount is a 409, before
// and after the hold arrives, and the same amount spelt otherwise is a
// duplicate. One stored without an amount takes a redelivery that gives
// one (it could not have conflicted with anything), and one stored before
// the amount counted (its hash made with 0) is still a duplicate.
func TestPostOfNoHoldKeepsItsAmount(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.createUser(7)
	withAmount := func(id, typ, amount string) []byte {
		return resolveBody(id, typ, 7, "h-1", map[string]string{"amount": `"` + amount + `"`})
	}
	for _, typ := range []string{"withdrawal_post", "withdrawal_void"} {
		id := "early-" + typ
		require.Equal(t, "accepted", h.postPayment(withAmount(id, typ, "30")).body["status"])
		require.Equal(t, "duplicate", h.postPayment(withAmount(id, typ, "30.0")).body["status"], "the same amount")
		requireCode(t, h.postPayment(withAmount(id, typ, "31")), http.StatusConflict, httpapi.CodeConflict)
		requireCode(t, h.postPayment(resolveBody(id, typ, 7, "h-1", nil)), http.StatusConflict, httpapi.CodeConflict)

		bare := "bare-" + typ
		require.Equal(t, "accepted", h.postPayment(resolveBody(bare, typ, 7, "h-1", nil)).body["status"])
		require.Equal(t, "duplicate", h.postPayment(withAmount(bare, typ, "30")).body["status"], "stored without an amount")
	}
	// Stored as before the amount counted: amount 0 in its hash.
	ctx := context.Background()
	legacy := payment.Event{ID: "legacy-post", Type: payment.WithdrawalPost, UserID: 7, Asset: "ETH", HoldID: "h-1",
		Network: payment.DefaultNetwork, TraceID: "t-legacy"}
	inserted, err := h.db.InsertEvent(ctx, postgres.NewEvent{Event: legacy, Source: postgres.SourcePayments})
	require.NoError(t, err)
	require.True(t, inserted)
	require.Equal(t, "duplicate", h.postPayment(withAmount("legacy-post", "withdrawal_post", "30")).body["status"], "stored before the amount counted")
	require.Equal(t, 0, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE hold_id = 'h-1' AND amount <> 0`), "stored with amount 0, the ledger's mark")

	// Once the hold exists: the same answers.
	require.Equal(t, "accepted", h.postPayment(holdBody("h-1", 7, "30", nil)).body["status"])
	for _, typ := range []string{"withdrawal_post", "withdrawal_void"} {
		id := "early-" + typ
		require.Equal(t, "duplicate", h.postPayment(withAmount(id, typ, "30")).body["status"])
		// Now no amount means the hold's, the one it gave.
		require.Equal(t, "duplicate", h.postPayment(resolveBody(id, typ, 7, "h-1", nil)).body["status"])
		require.Equal(t, "duplicate", h.postPayment(withAmount("bare-"+typ, typ, "30")).body["status"])
	}
	require.Equal(t, "duplicate", h.postPayment(withAmount("legacy-post", "withdrawal_post", "30")).body["status"])
}

func holdFirst(c postgres.Claimed) int {
	if c.Event.Type == payment.WithdrawalHold {
		return 0
	}
	return 1
}

// TestHoldOnANetworkTakenOutOfNetworks: a hold placed on BASE_MAINNET
// while it was enabled is still voided, or posted without a transaction,
// after BASE_MAINNET left NETWORKS (both were refused 400, and the funds
// stayed held); a post naming a transaction there still is refused,
// since no worker here would ask that chain.
func TestHoldOnANetworkTakenOutOfNetworks(t *testing.T) {
	before := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Networks = []string{"ETH_MAINNET", "BASE_MAINNET"} }})
	before.createUser(7)
	execSQL(t, before.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'USDC', 100, 100)`)
	for _, id := range []string{"h-void", "h-post"} {
		r := before.postPayment(holdBody(id, 7, "25", map[string]string{"asset": `"USDC"`, "network": `"BASE_MAINNET"`, "to_address": `"` + holdRecipient + `"`}))
		require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	}
	before.settleAll()

	after := newHarness(t, harnessOptions{dsn: before.dsn}) // NETWORKS=ETH_MAINNET
	r := after.postPayment(resolveBody("p-tx", "withdrawal_post", 7, "h-post", map[string]string{"tx_hash": `"0x` + strings.Repeat("ab", 32) + `"`}))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.raw)
	require.Contains(t, string(r.raw), "not enabled here")
	r = after.postPayment(resolveBody("v", "withdrawal_void", 7, "h-void", nil))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	r = after.postPayment(resolveBody("p", "withdrawal_post", 7, "h-post", nil))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	after.settleAll()
	require.Equal(t, 1, countRows(t, after.dsn, `SELECT count(*) FROM holds WHERE hold_id = 'h-void' AND status = 'voided'`))
	require.Equal(t, 1, countRows(t, after.dsn, `SELECT count(*) FROM holds WHERE hold_id = 'h-post' AND status = 'posted'`))
	require.Equal(t, 1, countRows(t, after.dsn, `SELECT count(*) FROM balances WHERE user_id = 7 AND asset = 'USDC' AND balance = 75 AND held = 0`))
}

// TestPostOfNoHoldWithoutTheDefaultNetwork: a post or void whose hold id
// names no hold is accepted where ETH_MAINNET (its placeholder network)
// is not in NETWORKS, with or without a transaction: it asks no chain and
// ends unknown_hold. It was a 400 naming a network its sender never did.
func TestPostOfNoHoldWithoutTheDefaultNetwork(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Networks = []string{"BASE_MAINNET"} }})
	h.createUser(7)
	for _, body := range [][]byte{
		resolveBody("p-none", "withdrawal_post", 7, "no-such-hold", nil),
		resolveBody("p-none-tx", "withdrawal_post", 7, "no-such-hold", map[string]string{"tx_hash": `"0x` + strings.Repeat("cd", 32) + `"`}),
		resolveBody("v-none", "withdrawal_void", 7, "no-such-hold", nil),
	} {
		r := h.postPayment(body)
		require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
		require.Equal(t, "accepted", r.body["status"], "%s", r.raw)
	}
	h.settleAll()
	require.Equal(t, 3, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE hold_id = 'no-such-hold' AND status = 'failed' AND outcome = 'unknown_hold'`))
}

// TestResolveRepeatingItsHoldsFields: a post or void may repeat its
// hold's asset, network and to_address; one that says otherwise is a 400
// naming the field (they were silently replaced by the hold's), told only
// to the hold's owner: another user's ends unknown_hold as before.
func TestResolveRepeatingItsHoldsFields(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) { o.Networks = []string{"ETH_MAINNET", "BASE_MAINNET"} }})
	h.createUser(7)
	h.createUser(8)
	execSQL(t, h.dsn, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'ETH', 100, 100)`)
	require.Equal(t, "accepted", h.postPayment(holdBody("h-1", 7, "10", map[string]string{"to_address": `"` + holdRecipient + `"`})).body["status"])
	h.settleAll()

	for field, extra := range map[string]map[string]string{
		"asset":      {"asset": `"USDC"`},
		"network":    {"network": `"BASE_MAINNET"`},
		"to_address": {"to_address": `"0x00000000000000000000000000000000000000cd"`},
	} {
		r := h.postPayment(resolveBody("p-"+field, "withdrawal_post", 7, "h-1", extra))
		requireCode(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest)
		require.Contains(t, string(r.raw), field+" must be the hold's", field)
		r = h.postPayment(resolveBody("o-"+field, "withdrawal_post", 8, "h-1", extra))
		require.Equal(t, "accepted", r.body["status"], "another user's post learns nothing: %s", r.raw)
	}
	same := map[string]string{"asset": `"ETH"`, "network": `"ETH_MAINNET"`, "to_address": `"` + strings.ToLower(holdRecipient) + `"`}
	require.Equal(t, "accepted", h.postPayment(resolveBody("p-same", "withdrawal_post", 7, "h-1", same)).body["status"])
	h.settleAll()
	require.Equal(t, 1, countRows(t, h.dsn, `SELECT count(*) FROM holds WHERE hold_id = 'h-1' AND status = 'posted' AND resolved_by = 'p-same'`))
	require.Equal(t, 3, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id LIKE 'o-%' AND outcome = 'unknown_hold'`))
	require.Zero(t, countRows(t, h.dsn, `SELECT count(*) FROM payment_events WHERE event_id LIKE 'p-%' AND event_id <> 'p-same'`))
}
