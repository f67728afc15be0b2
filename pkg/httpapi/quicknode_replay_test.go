package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/quicknode"
)

// signedQuickNode is a captured QuickNode request: its headers, signed
// over nonce, timestamp and body.
func signedQuickNode(nonce string, sent time.Time, body []byte) map[string]string {
	ts := strconv.FormatInt(sent.Unix(), 10)
	return map[string]string{"Content-Type": "application/json", httpapi.HeaderQuickNodeNonce: nonce,
		httpapi.HeaderQuickNodeTimestamp: ts, httpapi.HeaderQuickNodeSignature: quicknode.Sign(nonce, ts, body, []byte(quickNodeToken))}
}

// TestQuickNodeReplayWithinWindow: X-QN-Nonce is QuickNode's anti-replay
// value, so a signed delivery sent again unchanged (nonce, timestamp,
// signature, body) while its timestamp is still inside WEBHOOK_MAX_AGE
// changes nothing. The case that matters, on a network without an RPC: a
// deposit is reported (delivery A), QuickNode then reports its block
// reorged and the deposit is reversed; A replayed byte for byte must not
// reopen it. The replay is answered 200 with "replay": true and the
// transfer under duplicates (the contract's answer for a transfer that is
// already an event), and counted.
func TestQuickNodeReplayWithinWindow(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	bodyA := quickNodeLogs("0x1", false)
	captured := signedQuickNode("nonce-A0", fixedNow.Add(-2*time.Minute), bodyA)

	r := h.do(http.MethodPost, "/webhook/quicknode", bodyA, captured)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)

	r = h.postQuickNode(quickNodeLogs("0x1", true), fixedNow.Add(-time.Minute), false)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
	e, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status)

	// The captured request A, replayed unchanged.
	r = h.do(http.MethodPost, "/webhook/quicknode", bodyA, captured)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	e, err = h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status, "an exact replay reopened a deposit the reorg report had reversed: %s", r.raw)
	require.Equal(t, 1.0, r.body["duplicates"], "%s", r.raw)
	for _, count := range []string{"accepted", "reopened", "rechecked", "reversed", "ignored"} {
		require.Equal(t, 0.0, r.body[count], "%s in %s", count, r.raw)
	}
	require.Equal(t, true, r.body["replay"], "%s", r.raw)
	require.Equal(t, 1.0, counter(t, h.metrics, "settle_api_webhook_outcomes_total",
		map[string]string{"source": "quicknode", "outcome": "duplicate", "reason": "replay"}))

	// The same signed bytes split otherwise: the nonce's last '0' moved
	// to the front of the timestamp (the same time). The signature covers
	// them run together, so it still matches; the leading zero is refused.
	moved := map[string]string{}
	for k, v := range captured {
		moved[k] = v
	}
	moved[httpapi.HeaderQuickNodeNonce] = "nonce-A"
	moved[httpapi.HeaderQuickNodeTimestamp] = "0" + captured[httpapi.HeaderQuickNodeTimestamp]
	r = h.do(http.MethodPost, "/webhook/quicknode", bodyA, moved)
	requireError(t, r, http.StatusUnauthorized)
	e, err = h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status, "a replay split otherwise reopened the reversed deposit: %s", r.raw)

	// A new delivery of the same transfer (another nonce) is no replay:
	// the intake decides about it as ever.
	r = h.do(http.MethodPost, "/webhook/quicknode", bodyA, signedQuickNode("nonce-B", fixedNow, bodyA))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Nil(t, r.body["replay"], "%s", r.raw)
}

// TestQuickNodeCopiesAnswerLikeDuplicates: a provider's answer counts a
// transfer already an event under duplicates, and an exact copy of a
// delivery is answered so too. Copies sent at once wait for the first
// (no 503): one stores, the others are duplicates. A copy stores a
// transfer the first could not (its address was registered since), but
// a copy of a reorg report reverses nothing again.
func TestQuickNodeCopiesAnswerLikeDuplicates(t *testing.T) {
	h := providerHarness(t)
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	body := quickNodeLogs("0x1", false)
	hdr := signedQuickNode("nonce-par", fixedNow, body)
	const copies = 6
	answers := make(chan response, copies)
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() { answers <- h.do(http.MethodPost, "/webhook/quicknode", body, hdr) })
	}
	wg.Wait()
	close(answers)
	accepted, duplicates := 0.0, 0.0
	for r := range answers {
		require.Equal(t, http.StatusOK, r.status, "a copy sent at once: %s", r.raw)
		accepted += r.body["accepted"].(float64)
		duplicates += r.body["duplicates"].(float64)
	}
	require.Equal(t, 1.0, accepted)
	require.Equal(t, float64(copies-1), duplicates)

	// Reversed by a reorg report (no RPC: the report is the evidence),
	// then reported again in a new delivery: credited again.
	reorg := quickNodeLogs("0x1", true)
	reorgHdr := signedQuickNode("nonce-reorg", fixedNow, reorg)
	r := h.do(http.MethodPost, "/webhook/quicknode", reorg, reorgHdr)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)
	r = h.do(http.MethodPost, "/webhook/quicknode", body, signedQuickNode("nonce-again", fixedNow, body))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	before, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.NotEqual(t, payment.StatusFailed, before.Status, "reported again after the reorg report: %s", r.raw)
	// The reorg report's copy acts on nothing.
	r = h.do(http.MethodPost, "/webhook/quicknode", reorg, reorgHdr)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, true, r.body["replay"], "%s", r.raw)
	require.Equal(t, 0.0, r.body["reversed"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["ignored"], "%s", r.raw)
	after, err := h.db.Event(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, before.Status, after.Status, "a copy of the reorg report reversed the deposit again")

	// A transfer to an address not yet registered is ignored; a copy sent
	// after the address was registered stores it.
	other := "0x" + strings.Repeat("ab", 20)
	late := bytes.ReplaceAll(body, []byte(alchemyRecipient[2:]), []byte(other[2:]))
	late = bytes.ReplaceAll(late, []byte(alchemyTx), []byte("0x"+strings.Repeat("cd", 32)))
	lateHdr := signedQuickNode("nonce-late", fixedNow, late)
	r = h.do(http.MethodPost, "/webhook/quicknode", late, lateHdr)
	require.Equal(t, 1.0, r.body["ignored"], "%s", r.raw)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", other).status)
	r = h.do(http.MethodPost, "/webhook/quicknode", late, lateHdr)
	require.Equal(t, true, r.body["replay"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
}

// A delivery that was not answered 2xx is not remembered: the provider
// retries a failed delivery, possibly with the same nonce, and the retry
// is handled, not taken for a replay.
func TestQuickNodeFailedDeliveryIsNotAReplay(t *testing.T) {
	h := providerHarness(t)
	body := []byte(`{"data": "not a dataset"}`)
	hdr := signedQuickNode("nonce-bad", fixedNow, body)
	for range 2 {
		r := h.do(http.MethodPost, "/webhook/quicknode", body, hdr)
		requireError(t, r, http.StatusBadRequest)
	}
}

// With Redis unreachable, ingest goes on (the api needs only PostgreSQL
// for it) and replays are still refused: the replica remembers the
// deliveries it handled in process, and counts that it did.
func TestQuickNodeReplayGuardWithoutRedis(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	h := newHarness(t, harnessOptions{
		redisURL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), // nothing listens there
		change:   func(o *httpapi.Options) { o.QuickNodeTokens = []string{quickNodeToken} },
	})
	h.createUser(7)
	require.Equal(t, http.StatusCreated, h.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)

	body := quickNodeLogs("0x1", false)
	hdr := signedQuickNode("nonce-A", fixedNow, body)
	r := h.do(http.MethodPost, "/webhook/quicknode", body, hdr)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)

	r = h.do(http.MethodPost, "/webhook/quicknode", body, hdr)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, true, r.body["replay"], "%s", r.raw)
	require.Equal(t, 1.0, r.body["duplicates"], "%s", r.raw)
	require.GreaterOrEqual(t, counter(t, h.metrics, "settle_api_replay_guard_fallback_total", nil), 2.0)
}

// A kept claim outlives the delivery's window on every api replica, not
// only on the one that claimed it: api replicas' clocks differ. A
// delivery stamped at the future edge QuickNode may use (FutureSkewMax
// ahead) is taken by replica A; when its claim expires, replica B, whose
// clock is 30 s behind A's, must find the timestamp too old, or the
// captured delivery reopens the deposit a reorg report reversed.
func TestQuickNodeReplayClaimOutlivesTheWindowOnASkewedReplica(t *testing.T) {
	a := providerHarness(t)
	a.createUser(7)
	require.Equal(t, http.StatusCreated, a.addAddress(7, "ETH_MAINNET", alchemyRecipient).status)
	id := "chain:ETH_MAINNET:" + alchemyTx + ":1"

	bodyA := quickNodeLogs("0x1", false)
	captured := signedQuickNode("nonce-edge", fixedNow.Add(quicknode.FutureSkewMax-time.Second), bodyA)
	r := a.do(http.MethodPost, "/webhook/quicknode", bodyA, captured)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	require.Equal(t, 1.0, r.body["accepted"], "%s", r.raw)
	r = a.postQuickNode(quickNodeLogs("0x1", true), fixedNow, false)
	require.Equal(t, 1.0, r.body["reversed"], "%s", r.raw)

	ctx := context.Background()
	keys, err := a.redis.Keys(ctx, "settle:replay:quicknode:*").Result()
	require.NoError(t, err)
	var ttl time.Duration
	for _, k := range keys {
		if v, _ := a.redis.Get(ctx, k).Result(); v == "done" {
			pttl, err := a.redis.PTTL(ctx, k).Result()
			require.NoError(t, err)
			ttl = max(ttl, pttl)
		}
	}
	require.Positive(t, ttl, "no kept claim among %v", keys)
	// The claims run out: what Redis does once ttl has passed.
	require.NoError(t, a.redis.Del(ctx, keys...).Err())

	const skew = 30 * time.Second
	b := newHarness(t, harnessOptions{dsn: a.dsn, redisURL: a.redisURL, change: func(o *httpapi.Options) {
		o.QuickNodeTokens = []string{quickNodeToken}
		o.Now = func() time.Time { return fixedNow.Add(ttl).Add(-skew) }
	}})
	r = b.do(http.MethodPost, "/webhook/quicknode", bodyA, captured)
	e, err := a.db.Event(ctx, id)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, e.Status,
		"the claim expired %s after the delivery while a replica %s behind still took its timestamp: the replay reopened the reversed deposit: %s", ttl, skew, r.raw)
	requireError(t, r, http.StatusUnauthorized)
}
