package test

import (
	"context"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// Settings of the scanner tests: passes every 200ms, short leases so a
// killed scheduler's range is taken over within seconds.
var scannerEnv = map[string]string{"SCAN_INTERVAL": "200ms", "SCAN_PASS_TIMEOUT": "10s"}

func withEnv(base map[string]string, more map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// scheduler is the stack's (first) scheduler process.
func (c *chainStack) scheduler(t *testing.T) *harness.Proc {
	t.Helper()
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "scheduler") {
			return p
		}
	}
	t.Fatal("no scheduler in the stack")
	return nil
}

// cursor is the network's next block, -1 before the first pass.
func (c *chainStack) cursor(t *testing.T) int64 {
	t.Helper()
	var next int64 = -1
	_ = c.DB.QueryRow(context.Background(), `SELECT next_block FROM chain_cursors WHERE network = 'ETH_MAINNET'`).Scan(&next)
	return next
}

// waitScanned waits until the cursor has passed block.
func (c *chainStack) waitScanned(t *testing.T, block uint64) {
	t.Helper()
	c.WaitFor(fmt.Sprintf("cursor past block %d", block), time.Minute, func() bool { return c.cursor(t) > int64(block) })
}

// waitCredited waits for the event to exist (the scanner stores it on
// its own schedule), then to be confirmed.
func (c *chainStack) waitCredited(t *testing.T, id string) {
	t.Helper()
	c.WaitFor(id+" stored", time.Minute, func() bool {
		return c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1`, id) == 1
	})
	c.waitStatus(t, id, "confirmed")
}

func (c *chainStack) source(t *testing.T, id string) string {
	t.Helper()
	var source string
	require.NoError(t, c.DB.QueryRow(context.Background(), `SELECT source FROM payment_events WHERE event_id = $1`, id).Scan(&source))
	return source
}

func nativeID(tx devchain.Tx) string { return "chain:ETH_MAINNET:" + tx.Hash + ":native" }
func tokenID(tx devchain.Tx) string  { return "chain:ETH_MAINNET:" + tx.Hash + ":0" }

// TestScannerCreditsWhatNoWebhookReported: an ETH and a token transfer to
// registered addresses, with no webhook at all, are credited after
// finality and not before; a reverted transaction and a transfer to an
// unregistered address are not. An Alchemy delivery of a scanned transfer
// afterwards is a duplicate; one delivered before the scan makes the
// scan's a duplicate: one event and one credit each.
func TestScannerCreditsWhatNoWebhookReported(t *testing.T) {
	c := newChainStack(t, "finalized", scannerEnv)
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })

	ethTx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(2))
	require.NoError(t, err)
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(7_000_000))
	require.NoError(t, err)
	_, err = c.chain.SendETH(ctx, 0, "0x3333333333333333333333333333333333333333", wei(1))
	require.NoError(t, err)
	reverted, err := c.chain.SendReverting(ctx, 0, c.token)
	require.NoError(t, err)
	time.Sleep(time.Second) // several passes: nothing is final yet
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`), "nothing before finality")

	require.NoError(t, c.chain.FinalizeThrough(ctx, reverted.BlockNumber))
	c.waitCredited(t, nativeID(ethTx))
	c.waitCredited(t, tokenID(tokenTx))
	c.waitScanned(t, reverted.BlockNumber)
	require.Equal(t, "scanner", c.source(t, nativeID(ethTx)))
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "7", c.balance(t, 2, "TUSD"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM payment_events`), "no event for the reverted or unregistered ones")

	// Alchemy after the scan: a duplicate.
	status, answer := c.alchemy(t, alchemyETHPayload(addrUser1, ethTx, "0x1bc16d674ec80000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 0, answer["accepted"], answer)
	require.EqualValues(t, 1, answer["duplicates"], answer)

	// Alchemy before the scan: the scan's event is the duplicate.
	early, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(3_000_000))
	require.NoError(t, err)
	status, answer = c.alchemy(t, alchemyTokenPayload(c.token, addrUser2, early, "0x2dc6c0", false))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	require.NoError(t, c.chain.FinalizeThrough(ctx, early.BlockNumber))
	c.waitCredited(t, tokenID(early))
	c.waitScanned(t, early.BlockNumber)
	require.Equal(t, "alchemy", c.source(t, tokenID(early)))

	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "10", c.balance(t, 2, "TUSD"))
	require.Equal(t, 3, c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, 3, c.Count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, 3, c.Count(`SELECT count(*) FROM chain_transfers`))
	// The pass counts its deposits and sets the lag after its commit
	// moved the cursor (waitScanned).
	require.Eventually(t, func() bool {
		page := metricsPage(t, c.scheduler(t))
		scanned, _ := seriesValue(t, page, "settle_scan_deposits_total", `network="ETH_MAINNET",source="scanner"`)
		reported, _ := seriesValue(t, page, "settle_scan_deposits_total", `network="ETH_MAINNET",source="reported"`)
		lagBlocks, ok := seriesValue(t, page, "settle_scan_head_lag_blocks", `network="ETH_MAINNET"`)
		return scanned == 2 && reported == 1 && ok && lagBlocks == 0
	}, 30*time.Second, 20*time.Millisecond)
	page := metricsPage(t, c.scheduler(t))
	scanned, _ := seriesValue(t, page, "settle_scan_deposits_total", `network="ETH_MAINNET",source="scanner"`)
	reported, _ := seriesValue(t, page, "settle_scan_deposits_total", `network="ETH_MAINNET",source="reported"`)
	require.EqualValues(t, 2, scanned, "the two only the scanner saw: the providers' miss rate")
	require.EqualValues(t, 1, reported)
	lagBlocks, ok := seriesValue(t, page, "settle_scan_head_lag_blocks", `network="ETH_MAINNET"`)
	require.True(t, ok)
	require.Zero(t, lagBlocks)
	requireInvariants(t, c.Stack)
}

func metricsPage(t *testing.T, p *harness.Proc) string {
	t.Helper()
	_, page := get(t, p.URL()+"/metrics")
	return page
}

// TestScannerKilledAndTwoReplicas: two schedulers scan one chain while
// transfers are mined in many blocks and one of them is kill -9'd again
// and again in the middle of its passes: every transfer is credited
// exactly once (balances, journal, chain_transfers). Both ways of reading
// token transfers: by recipient (few registered addresses) and by
// contract in windows (many; forced here with SCAN_ADDRESSES_PER_CALL=1).
func TestScannerKilledAndTwoReplicas(t *testing.T) {
	for name, mode := range map[string]map[string]string{
		"by recipient": nil,
		// Reads in turn too: one block batch at a time.
		"by contract, windowed": {"SCAN_ADDRESSES_PER_CALL": "1", "SCAN_LOG_WINDOW": "1", "SCAN_BATCHES_IN_FLIGHT": "1"},
	} {
		t.Run(name, func(t *testing.T) { scannerKilledAndTwoReplicas(t, mode) })
	}
}

func scannerKilledAndTwoReplicas(t *testing.T, mode map[string]string) {
	settings := map[string]string{"SCAN_INTERVAL": "50ms", "SCAN_BLOCKS_MAX": "2", "SCAN_PASS_TIMEOUT": "3s"}
	maps.Copy(settings, mode)
	env := withEnv(scannerEnv, settings)
	c := newChainStack(t, "finalized", env)
	ctx := context.Background()
	victim := c.scheduler(t)
	c.StartScheduler(nil)
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })
	if want, ok := settings["SCAN_BATCHES_IN_FLIGHT"]; ok {
		require.Contains(t, victim.Logs(), `"batches_in_flight":`+want, "the scanner runs with the setting")
	}

	const transfers = 24
	var last devchain.Tx
	kills := 0
	for i := range transfers {
		var err error
		if i%2 == 0 {
			last, err = c.chain.SendETH(ctx, 0, addrUser1, wei(1))
		} else {
			last, err = c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(1_000_000))
		}
		require.NoError(t, err)
		if i%4 == 3 {
			// Finalize what was mined so far: the scanners have passes to
			// run while the victim is killed.
			require.NoError(t, c.chain.FinalizeThrough(ctx, last.BlockNumber))
			time.Sleep(time.Duration((50+30*i)%400) * time.Millisecond)
			victim.Kill()
			kills++
			victim.Start()
		}
	}
	require.NoError(t, c.chain.FinalizeThrough(ctx, last.BlockNumber))
	// Generous: race-built binaries on a loaded machine restart slowly.
	logged := time.Now()
	c.WaitFor("every transfer credited", 4*time.Minute, func() bool {
		confirmed := c.Count(`SELECT count(*) FROM payment_events WHERE status = 'confirmed'`)
		if time.Since(logged) > 15*time.Second {
			logged = time.Now()
			t.Logf("waiting: cursor %d (last transfer in block %d), %d events, %d confirmed", c.cursor(t), last.BlockNumber,
				c.Count(`SELECT count(*) FROM payment_events`), confirmed)
		}
		return confirmed == transfers
	})
	c.waitScanned(t, last.BlockNumber)
	time.Sleep(500 * time.Millisecond) // passes after the last one find nothing new
	require.Equal(t, transfers, c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, transfers, c.Count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, transfers, c.Count(`SELECT count(*) FROM chain_transfers`))
	require.Equal(t, fmt.Sprint(transfers/2), c.balance(t, 1, "ETH"))
	require.Equal(t, fmt.Sprint(transfers/2), c.balance(t, 2, "TUSD"))
	t.Logf("%d kills", kills)
	requireInvariants(t, c.Stack)
}

// journal is every balance_events row, in order, as text.
func (c *chainStack) journal(t *testing.T) []string {
	t.Helper()
	rows, err := c.DB.Query(context.Background(), `SELECT source_event_id || ' ' || user_id || ' ' || asset || ' ' || amount::text FROM balance_events ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		out = append(out, line)
	}
	require.NoError(t, rows.Err())
	return out
}

func (c *chainStack) waitJob(t *testing.T, id string) map[string]any {
	t.Helper()
	var job map[string]any
	c.WaitFor("job "+id+" done", time.Minute, func() bool {
		status, body, err := c.client.Admin(http.MethodGet, "/admin/rescan/"+id, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, body)
		require.NotEqual(t, "failed", body["status"], body)
		job = body
		return body["status"] == "done"
	})
	return job
}

// TestScannerBackfillAndRescan: transfers reach an address before it is
// registered (the scanner passes them by); registered with from_block,
// they are credited. Rescans of the whole range afterwards, by the API
// and by settlectl, change nothing: same balances, same journal, same
// events.
func TestScannerBackfillAndRescan(t *testing.T) {
	c := newChainStack(t, "finalized", scannerEnv)
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })
	const late = "0x4444444444444444444444444444444444444444"
	ethTx, err := c.chain.SendETH(ctx, 0, late, wei(3))
	require.NoError(t, err)
	tokenTx, err := c.chain.TransferToken(ctx, 0, c.token, late, big.NewInt(4_000_000))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, tokenTx.BlockNumber))
	c.waitScanned(t, tokenTx.BlockNumber)
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`), "an unregistered address is passed by")

	status, body, err := c.client.Admin(http.MethodPost, "/admin/deposit-addresses",
		map[string]any{"address": late, "network": "ETH_MAINNET", "user_id": 1, "from_block": ethTx.BlockNumber})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	backfill, ok := body["backfill"].(string)
	require.True(t, ok, body)
	job := c.waitJob(t, backfill)
	c.waitCredited(t, nativeID(ethTx))
	c.waitCredited(t, tokenID(tokenTx))
	require.EqualValues(t, 2, job["found"], job)
	require.Equal(t, "3", c.balance(t, 1, "ETH"))
	require.Equal(t, "4", c.balance(t, 1, "TUSD"))

	journal := c.journal(t)
	require.Len(t, journal, 2)
	head, err := c.chain.Finalized(ctx)
	require.NoError(t, err)
	status, body, err = c.client.Admin(http.MethodPost, "/admin/rescan", map[string]any{"network": "ETH_MAINNET", "from_block": 0, "to_block": head})
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, status, body)
	job = c.waitJob(t, body["id"].(string))
	require.EqualValues(t, 2, job["found"], "the rescan finds both again: %v", job)
	require.EqualValues(t, head+1, job["blocks_done"], job)

	out, code := c.Settlectl("rescan", "--network", "ETH_MAINNET", "--from", "0", "--to", fmt.Sprint(head))
	require.Equal(t, 0, code, out)
	var id string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), `"id": "`); ok {
			id = strings.TrimSuffix(v, `",`)
		}
	}
	require.NotEmpty(t, id, out)
	c.WaitFor("settlectl's rescan done", time.Minute, func() bool {
		out, code := c.Settlectl("rescan", "status", id)
		require.Equal(t, 0, code, out)
		return strings.Contains(out, `"status": "done"`)
	})
	out, code = c.Settlectl("rescan", "--network", "ETH_MAINNET", "--from", "5", "--to", "4")
	require.NotEqual(t, 0, code, out)

	time.Sleep(time.Second) // the worker settles whatever a rescan might have stored
	require.Equal(t, journal, c.journal(t), "the journal is unchanged")
	require.Equal(t, "3", c.balance(t, 1, "ETH"))
	require.Equal(t, "4", c.balance(t, 1, "TUSD"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM chain_transfers`))
	requireInvariants(t, c.Stack)
}
