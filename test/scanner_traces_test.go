package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

// scannerTracesEnv: the scanner tests' settings with internal transfers.
var scannerTracesEnv = withEnv(scannerEnv, map[string]string{"SCAN_TRACES": "on"})

func traceID(tx devchain.Tx, traceAddress string) string {
	return "chain:ETH_MAINNET:" + tx.Hash + ":trace:" + strings.ToLower(traceAddress)
}

// alchemyInternalPayload is Alchemy's internal activity for ETH a
// contract call moved: category internal, named by typeTraceAddress.
func alchemyInternalPayload(to string, tx devchain.Tx, traceAddress, rawValue string) []byte {
	b, _ := json.Marshal(map[string]any{
		"webhookId": "wh_test", "id": "whevt_int_" + tx.Hash[2:14], "createdAt": time.Now().UTC().Format(time.RFC3339),
		"type": "ADDRESS_ACTIVITY",
		"event": map[string]any{"network": "ETH_MAINNET", "activity": []any{map[string]any{
			"fromAddress": "0x9999999999999999999999999999999999999999", "toAddress": to,
			"blockNum": fmt.Sprintf("0x%x", tx.BlockNumber), "hash": tx.Hash, "value": 1, "asset": "ETH", "category": "internal",
			"typeTraceAddress": traceAddress,
			"rawContract":      map[string]any{"rawValue": rawValue, "address": nil, "decimals": 18},
		}}},
	})
	return b
}

// scanMetric sums the scheduler's samples of a metric whose line holds
// every one of parts.
func (c *chainStack) scanMetric(t *testing.T, name string, parts ...string) float64 {
	t.Helper()
	resp, err := http.Get(c.scheduler(t).URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum := 0.0
lines:
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue lines
			}
		}
		var v float64
		_, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
		require.NoError(t, err, line)
		sum += v
	}
	return sum
}

// TestScannerCreditsInternalTransfers: with SCAN_TRACES=on and no webhook,
// ETH a contract forwards to a registered address (directly, and two
// calls deep) is credited after finality, once; a forward whose frame
// reverted (the transaction succeeded) is not. Alchemy's internal
// activity of a scanned transfer is a duplicate, and one delivered first
// makes the scan's the duplicate: one event and one credit each. The
// scan traces each block once, counted in the scanner's RPC metric, and a
// from_block backfill finds internal transfers too.
func TestScannerCreditsInternalTransfers(t *testing.T) {
	c := newChainStack(t, "finalized", scannerTracesEnv)
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })
	forwarder, _, err := c.chain.DeployForwarder(ctx, 0)
	require.NoError(t, err)

	direct, err := c.chain.SendForward(ctx, 0, forwarder, addrUser1, wei(2), devchain.ForwardDirect)
	require.NoError(t, err)
	reverted, err := c.chain.SendForward(ctx, 0, forwarder, addrUser1, wei(5), devchain.ForwardReverted)
	require.NoError(t, err)
	nested, err := c.chain.SendForward(ctx, 0, forwarder, addrUser2, wei(3), devchain.ForwardNested)
	require.NoError(t, err)
	require.Equal(t, uint64(1), reverted.Status, "the transaction succeeds; only its inner frame reverted")
	time.Sleep(time.Second) // several passes: nothing is final yet
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events`), "nothing before finality")

	require.NoError(t, c.chain.FinalizeThrough(ctx, nested.BlockNumber))
	c.waitCredited(t, traceID(direct, "CALL_0"))
	c.waitCredited(t, traceID(nested, "CALL_0_0"))
	c.waitScanned(t, nested.BlockNumber)
	require.Equal(t, "scanner", c.source(t, traceID(direct, "CALL_0")))
	require.Equal(t, "2", c.balance(t, 1, "ETH"))
	require.Equal(t, "3", c.balance(t, 2, "ETH"))
	require.Equal(t, 2, c.Count(`SELECT count(*) FROM payment_events`), "none for the reverted forward")
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, reverted.Hash))

	traced := c.scanMetric(t, "settle_scan_rpc_calls_total", `method="debug_traceBlockByNumber"`)
	blocks := c.scanMetric(t, "settle_scan_blocks_total")
	require.Positive(t, traced, "trace calls are counted")
	require.LessOrEqual(t, traced, blocks, "at most one trace per block scanned")

	// Alchemy after the scan: a duplicate.
	status, answer := c.alchemy(t, alchemyInternalPayload(addrUser1, direct, "CALL_0", "0x1bc16d674ec80000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 0, answer["accepted"], answer)
	require.EqualValues(t, 1, answer["duplicates"], answer)

	// Alchemy before the scan: the scan's event is the duplicate.
	early, err := c.chain.SendForward(ctx, 0, forwarder, addrUser2, wei(4), devchain.ForwardNested)
	require.NoError(t, err)
	status, answer = c.alchemy(t, alchemyInternalPayload(addrUser2, early, "CALL_0_0", "0x3782dace9d900000"))
	require.Equal(t, http.StatusOK, status, answer)
	require.EqualValues(t, 1, answer["accepted"], answer)
	require.NoError(t, c.chain.FinalizeThrough(ctx, early.BlockNumber))
	c.waitCredited(t, traceID(early, "CALL_0_0"))
	c.waitScanned(t, early.BlockNumber)
	require.Equal(t, "alchemy", c.source(t, traceID(early, "CALL_0_0")))
	require.Equal(t, "7", c.balance(t, 2, "ETH"))
	require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, early.Hash))

	// A backfill: a forward to an address registered later, with from_block.
	const late = "0x4444444444444444444444444444444444444444"
	lateTx, err := c.chain.SendForward(ctx, 0, forwarder, late, wei(6), devchain.ForwardDirect)
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, lateTx.BlockNumber))
	c.waitScanned(t, lateTx.BlockNumber)
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, lateTx.Hash), "an unregistered address is passed by")
	status, body, err := c.client.Admin(http.MethodPost, "/admin/deposit-addresses",
		map[string]any{"address": late, "network": "ETH_MAINNET", "user_id": 1, "from_block": lateTx.BlockNumber})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	c.waitCredited(t, traceID(lateTx, "CALL_0"))
	require.Equal(t, "8", c.balance(t, 1, "ETH"))

	time.Sleep(time.Second) // more passes and the worker: still one credit each
	require.Equal(t, 4, c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, 4, c.Count(`SELECT count(*) FROM chain_transfers`))
	requireInvariants(t, c.Stack)
}

// TestScannerTracesOff: with SCAN_TRACES=off the same forward is not
// found (a native transfer after it, to know the scan passed, is).
func TestScannerTracesOff(t *testing.T) {
	c := newChainStack(t, "finalized", scannerEnv)
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })
	forwarder, _, err := c.chain.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	forward, err := c.chain.SendForward(ctx, 0, forwarder, addrUser1, wei(2), devchain.ForwardDirect)
	require.NoError(t, err)
	after, err := c.chain.SendETH(ctx, 0, addrUser2, wei(1))
	require.NoError(t, err)
	require.NoError(t, c.chain.FinalizeThrough(ctx, after.BlockNumber))
	c.waitCredited(t, nativeID(after))
	c.waitScanned(t, after.BlockNumber)
	require.Equal(t, 0, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, forward.Hash))
	require.Zero(t, c.scanMetric(t, "settle_scan_rpc_calls_total", `method="debug_traceBlockByNumber"`))
	require.Equal(t, "0", c.balance(t, 1, "ETH"))
}

// TestScannerRefusesTracesWithoutDebugAPI: SCAN_TRACES=on against a node
// that does not serve debug_traceBlockByNumber: the scheduler refuses to
// start and names the setting, rather than scan without the internal
// transfers it was asked for.
func TestScannerRefusesTracesWithoutDebugAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	_, err = ch.Commit(ctx)
	require.NoError(t, err)
	s := harness.NewStack(t)
	env := withEnv(s.Env, map[string]string{
		"ETH_RPC_URL": ch.URL(), "DEPOSIT_FINALITY": "finalized",
		"SCAN_INTERVAL": "1s", "SCAN_TRACES": "on", "METRICS_ADDR": "127.0.0.1:0",
	})
	cmd := exec.CommandContext(ctx, filepath.Join(harness.Binaries(t), "scheduler"))
	cmd.Env = testenv.Env(env)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.NotEqual(t, 0, exitErr.ExitCode())
	require.Contains(t, string(out), "SCAN_TRACES=on")
	require.Contains(t, string(out), "debug_traceBlockByNumber")
	require.NotContains(t, string(out), "could not be asked", "told apart from an outage: %s", out)
}
