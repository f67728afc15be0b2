package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

// payoutAddress is where the holds of these tests pay out.
const payoutAddress = "0x3333333333333333333333333333333333333333"

func holdWebhook(t *testing.T, c *harness.Client, id string, user int64, asset, amount string, extra map[string]any) string {
	t.Helper()
	fields := map[string]any{"event_id": id, "event_type": "withdrawal_hold", "user_id": user, "asset": asset, "amount": amount}
	for k, v := range extra {
		fields[k] = v
	}
	return sendWebhook(t, c, fields)
}

func resolveWebhook(t *testing.T, c *harness.Client, id, typ string, user int64, holdID string, extra map[string]any) string {
	t.Helper()
	fields := map[string]any{"event_id": id, "event_type": typ, "user_id": user, "hold_id": holdID}
	for k, v := range extra {
		fields[k] = v
	}
	return sendWebhook(t, c, fields)
}

func sendWebhook(t *testing.T, c *harness.Client, fields map[string]any) string {
	t.Helper()
	body, err := json.Marshal(fields)
	require.NoError(t, err)
	status, resp, err := c.Webhook(body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, resp)
	return resp["status"].(string)
}

type fundsRow struct{ balance, held string }

func funds(t *testing.T, s *harness.Stack, user int64, asset string) fundsRow {
	t.Helper()
	var f fundsRow
	require.NoError(t, s.DB.QueryRow(context.Background(),
		`SELECT balance::numeric(38,0)::text, held::numeric(38,0)::text FROM balances WHERE user_id = $1 AND asset = $2`, user, asset).Scan(&f.balance, &f.held))
	return f
}

func holdState(t *testing.T, s *harness.Stack, id string) (status, resolvedBy string) {
	t.Helper()
	require.NoError(t, s.DB.QueryRow(context.Background(), `SELECT status, COALESCE(resolved_by, '') FROM holds WHERE hold_id = $1`, id).Scan(&status, &resolvedBy))
	return status, resolvedBy
}

// TestPostReorgedIsReported: under confirmations:1 a post settles before
// its payout's block is final and is watched; a real reorg drops the
// payout. The worker records it on the post, counts it and alerts; the
// user stays debited and the hold posted (the funds are an operator's
// call), and nothing else is written.
func TestPostReorgedIsReported(t *testing.T) {
	c := stackWithOpenHold(t)
	ctx := context.Background()
	paid, err := c.chain.SendETH(ctx, 0, payoutAddress, wei(10))
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-1", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": paid.Hash})
	c.waitStatus(t, "p-1", "confirmed")
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'p-1' AND chain_state = 'watching'`))
	require.Equal(t, fundsRow{"90", "0"}, funds(t, c.Stack, 1, "ETH"))
	worker := c.worker.URL()
	require.Zero(t, metricValue(worker, `settle_payout_reorged_total{network="ETH_MAINNET"}`))

	_, err = c.chain.Reorg(ctx, paid.Hash)
	require.NoError(t, err)
	c.WaitFor("payout reorged", time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'p-1' AND chain_state = 'reorged'`) == 1
	})
	status, outcome, reason := c.event(t, "p-1")
	require.Equal(t, []string{"confirmed", "success"}, []string{status, outcome})
	require.Contains(t, reason, paid.Hash)
	c.WaitFor("counted", 10*time.Second, func() bool {
		return metricValue(worker, `settle_payout_reorged_total{network="ETH_MAINNET"}`) == 1
	})
	time.Sleep(time.Second) // a few more watcher passes: nothing more may happen
	require.Equal(t, float64(1), metricValue(worker, `settle_payout_reorged_total{network="ETH_MAINNET"}`))
	require.Equal(t, fundsRow{"90", "0"}, funds(t, c.Stack, 1, "ETH"))
	hold, by := holdState(t, c.Stack, "h-1")
	require.Equal(t, []string{"posted", "p-1"}, []string{hold, by})
	require.Zero(t, c.Count(`SELECT count(*) FROM payment_events WHERE event_id NOT IN ('h-1', 'p-1')`))
	requireInvariants(t, c.Stack)
}

// TestPostSettlesOnChain: a post whose transaction reverts, or pays
// another amount, fails with that outcome and leaves the hold open; a
// later post with a transaction that pays the hold's amount to its
// to_address debits once; a redelivered post is a duplicate; another
// hold posted with that payment is a duplicate_transfer.
func TestPostSettlesOnChain(t *testing.T) {
	c := stackWithOpenHold(t)
	ctx := context.Background()
	require.Equal(t, fundsRow{"100", "10"}, funds(t, c.Stack, 1, "ETH"))

	reverted, err := c.chain.SendReverting(ctx, 0, c.token)
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-rev", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": reverted.Hash})
	c.waitStatus(t, "p-rev", "failed")
	_, outcome, _ := c.event(t, "p-rev")
	require.Equal(t, "reverted", outcome)

	short, err := c.chain.SendETH(ctx, 0, payoutAddress, wei(3))
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-short", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": short.Hash})
	elsewhere, err := c.chain.SendETH(ctx, 0, addrUser2, wei(10))
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-elsewhere", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": elsewhere.Hash})
	for _, id := range []string{"p-short", "p-elsewhere"} {
		c.waitStatus(t, id, "failed")
		_, outcome, reason := c.event(t, id)
		require.Equal(t, "mismatch", outcome, id)
		require.NotEmpty(t, reason)
	}
	status, _ := holdState(t, c.Stack, "h-1")
	require.Equal(t, "open", status, "a failed post leaves the hold open")
	require.Equal(t, fundsRow{"100", "10"}, funds(t, c.Stack, 1, "ETH"))
	require.Zero(t, c.Count(`SELECT count(*) FROM balance_events`))

	good, err := c.chain.SendETH(ctx, 0, payoutAddress, wei(10))
	require.NoError(t, err)
	require.Equal(t, "accepted", resolveWebhook(t, c.client, "p-good", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": good.Hash}))
	c.waitStatus(t, "p-good", "confirmed")
	require.Equal(t, fundsRow{"90", "0"}, funds(t, c.Stack, 1, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'p-good' AND event_type = 'withdrawal' AND amount = -10`))
	status, by := holdState(t, c.Stack, "h-1")
	require.Equal(t, "posted", status)
	require.Equal(t, "p-good", by)
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE event_id = 'p-good' AND block_number = $1 AND chain_state IN ('watching', 'final')`, int64(good.BlockNumber)),
		"the payment out is recorded, and watched until final (confirmations:1)")

	// The provider redelivers the post: a duplicate, no second debit.
	require.Equal(t, "duplicate", resolveWebhook(t, c.client, "p-good", "withdrawal_post", 1, "h-1", map[string]any{"tx_hash": good.Hash, "amount": "10"}))
	// Void after post, and a second post: hold_closed.
	resolveWebhook(t, c.client, "v-late", "withdrawal_void", 1, "h-1", nil)
	c.waitStatus(t, "v-late", "failed")
	_, outcome, _ = c.event(t, "v-late")
	require.Equal(t, "hold_closed", outcome)
	// A post naming no hold ends unknown_hold, with a transaction too:
	// it has no payout for the chain to check.
	require.Equal(t, "accepted", resolveWebhook(t, c.client, "p-no-hold", "withdrawal_post", 1, "no-such-hold", map[string]any{"tx_hash": short.Hash}))
	c.waitStatus(t, "p-no-hold", "failed")
	_, outcome, _ = c.event(t, "p-no-hold")
	require.Equal(t, "unknown_hold", outcome)
	c.WaitFor("quiet", 30*time.Second, c.AllTerminal)
	require.Equal(t, fundsRow{"90", "0"}, funds(t, c.Stack, 1, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM balance_events`))

	// A token hold is paid by a Transfer log of the token.
	_, err = c.DB.Exec(ctx, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (2, 'TUSD', 50, 50)`)
	require.NoError(t, err)
	holdWebhook(t, c.client, "h-tok", 2, "TUSD", "5", map[string]any{"to_address": payoutAddress})
	c.waitStatus(t, "h-tok", "confirmed")
	paid, err := c.chain.TransferToken(ctx, 0, c.token, payoutAddress, big.NewInt(5_000_000))
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-tok", "withdrawal_post", 2, "h-tok", map[string]any{"tx_hash": paid.Hash})
	c.waitStatus(t, "p-tok", "confirmed")
	require.Equal(t, fundsRow{"45", "0"}, funds(t, c.Stack, 2, "TUSD"))

	// One payment settles one hold: a second hold of the same amount to
	// the same address, posted with the transaction that paid h-1, is a
	// duplicate_transfer and stays open until its own payment.
	holdWebhook(t, c.client, "h-2", 1, "ETH", "10", map[string]any{"to_address": payoutAddress})
	c.waitStatus(t, "h-2", "confirmed")
	resolveWebhook(t, c.client, "p-again", "withdrawal_post", 1, "h-2", map[string]any{"tx_hash": good.Hash})
	c.waitStatus(t, "p-again", "failed")
	_, outcome, reason := c.event(t, "p-again")
	require.Equal(t, "duplicate_transfer", outcome)
	require.Contains(t, reason, "already settles another post")
	status, _ = holdState(t, c.Stack, "h-2")
	require.Equal(t, "open", status)
	require.Equal(t, fundsRow{"90", "10"}, funds(t, c.Stack, 1, "ETH"))
	second, err := c.chain.SendETH(ctx, 0, payoutAddress, wei(10))
	require.NoError(t, err)
	resolveWebhook(t, c.client, "p-2", "withdrawal_post", 1, "h-2", map[string]any{"tx_hash": second.Hash})
	c.waitStatus(t, "p-2", "confirmed")
	require.Equal(t, fundsRow{"80", "0"}, funds(t, c.Stack, 1, "ETH"))
	require.Equal(t, 3, c.Count(`SELECT count(*) FROM payout_transfers`), "p-good, p-tok and p-2 each hold their transfer")
	requireInvariants(t, c.Stack)
}

// TestConcurrentHoldsThroughTwoWorkers: 50 holds of 10 against a balance
// of 100, sent on separate connections, one event per task, settled by two
// worker processes: exactly 10 are held, and a sampler reading SQL during
// the race never sees SUM(open holds) > balance.
func TestConcurrentHoldsThroughTwoWorkers(t *testing.T) {
	s := harness.NewStack(t)
	s.Env["POLL_INTERVAL"] = "100ms"
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartWorker(nil)
	s.StartScheduler(map[string]string{"TASK_EVENTS_MAX": "1"})
	client := harness.NewClient(api.URL())
	createUsers(t, client, 7, 8)
	ctx := context.Background()
	_, err := s.DB.Exec(ctx, `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (7, 'ETH', 100, 100)`)
	require.NoError(t, err)

	sampler, err := pgx.Connect(ctx, s.DatabaseURL)
	require.NoError(t, err)
	defer sampler.Close(ctx)
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		samples := 0
		defer func() { done <- samples }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var over bool
			if err := sampler.QueryRow(ctx, `SELECT COALESCE((SELECT SUM(amount) FROM holds WHERE user_id = 7 AND status = 'open'), 0)
				> (SELECT balance FROM balances WHERE user_id = 7 AND asset = 'ETH')`).Scan(&over); err != nil || over {
				t.Errorf("sample %d: over=%v err=%v", samples, over, err)
				return
			}
			samples++
		}
	}()

	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := harness.NewClient(api.URL()) // its own connection
			holdWebhook(t, own, fmt.Sprintf("h-%d", i), 7, "ETH", "10", nil)
		}()
	}
	wg.Wait()
	s.WaitFor("holds settled", time.Minute, s.AllTerminal)
	close(stop)
	require.Positive(t, <-done)
	require.Equal(t, 10, s.Count(`SELECT count(*) FROM payment_events WHERE outcome = 'held'`))
	require.Equal(t, 40, s.Count(`SELECT count(*) FROM payment_events WHERE outcome = 'insufficient_funds'`))
	require.Equal(t, 10, s.Count(`SELECT count(*) FROM holds WHERE status = 'open'`))
	require.Equal(t, fundsRow{"100", "100"}, funds(t, s, 7, "ETH"))
	require.Zero(t, s.Count(`SELECT count(*) FROM balance_events`))

	// A withdrawal that would take held money fails insufficient_funds.
	body := harness.Payment("w-1", "withdrawal", 7, "ETH", "1")
	status, resp, err := client.Webhook(body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, resp)
	// Another user's post is unknown_hold; void after void is hold_closed.
	var held []string
	rows, err := s.DB.Query(ctx, `SELECT hold_id FROM holds ORDER BY hold_id LIMIT 2`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		held = append(held, id)
	}
	require.NoError(t, rows.Err())
	resolveWebhook(t, client, "p-other", "withdrawal_post", 8, held[0], nil)
	resolveWebhook(t, client, "v-1", "withdrawal_void", 7, held[0], nil)
	resolveWebhook(t, client, "p-1", "withdrawal_post", 7, held[1], nil)
	s.WaitFor("resolutions settled", time.Minute, s.AllTerminal)
	resolveWebhook(t, client, "p-after-void", "withdrawal_post", 7, held[0], nil)
	require.Equal(t, "duplicate", resolveWebhook(t, client, "p-1", "withdrawal_post", 7, held[1], nil))
	// A hold id that names no hold is accepted and ends unknown_hold, with
	// or without an amount; nothing moves.
	require.Equal(t, "accepted", resolveWebhook(t, client, "p-unknown", "withdrawal_post", 7, "no-such-hold", nil))
	require.Equal(t, "accepted", resolveWebhook(t, client, "v-unknown", "withdrawal_void", 7, "no-such-hold", map[string]any{"amount": "10"}))
	require.Equal(t, "duplicate", resolveWebhook(t, client, "p-unknown", "withdrawal_post", 7, "no-such-hold", nil))
	s.WaitFor("all settled", time.Minute, s.AllTerminal)
	for id, want := range map[string]string{"w-1": "insufficient_funds", "p-other": "unknown_hold", "v-1": "success", "p-1": "success", "p-after-void": "hold_closed", "p-unknown": "unknown_hold", "v-unknown": "unknown_hold"} {
		var outcome string
		require.NoError(t, s.DB.QueryRow(ctx, `SELECT outcome FROM payment_events WHERE event_id = $1`, id).Scan(&outcome))
		require.Equal(t, want, outcome, id)
	}
	require.Equal(t, fundsRow{"90", "80"}, funds(t, s, 7, "ETH"))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'p-1' AND event_type = 'withdrawal' AND amount = -10`))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events`))

	var open string
	require.NoError(t, s.DB.QueryRow(ctx, `SELECT hold_id FROM holds WHERE status = 'open' LIMIT 1`).Scan(&open))
	out, code := s.Settlectl("holds", "list", "--user", "7", "--status", "open")
	require.Equal(t, 0, code, out)
	listed := func(id string) bool {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s`).MatchString(out)
	}
	require.True(t, listed(open), out)
	require.False(t, listed(held[0]), "a voided hold is not listed as open: %s", out)
	out, code = s.Settlectl("holds", "show", held[0])
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "voided")
	out, code = s.Settlectl("holds", "list", "--status", "pending")
	require.NotEqual(t, 0, code, out)
	out, code = s.Settlectl("holds", "show", "no-such-hold")
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "not found")
	out, code = s.Settlectl("holds", "show", held[1], "--json")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"resolved_by": "p-1"`)
	requireInvariants(t, s)
}

// stackWithOpenHold is a chain stack under confirmations:1 where user 1
// holds 10 of its 100 ETH as hold "h-1", to be paid to payoutAddress.
func stackWithOpenHold(t *testing.T) *chainStack {
	t.Helper()
	c := newChainStack(t, "confirmations:1", nil)
	_, err := c.DB.Exec(context.Background(), `INSERT INTO balances (user_id, asset, balance, initial_balance) VALUES (1, 'ETH', 100, 100)`)
	require.NoError(t, err)
	holdWebhook(t, c.client, "h-1", 1, "ETH", "10", map[string]any{"to_address": payoutAddress})
	c.waitStatus(t, "h-1", "confirmed")
	return c
}
