package test

import (
	"context"
	"encoding/json"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// registryRefresh is the REGISTRY_REFRESH of the test's processes.
const registryRefresh = 2 * time.Second

// registryStack is api, worker and scheduler on a dev chain of their own
// network, DEVNET, added with settlectl before they start (the worker
// checks its RPC's chain id against it), refreshing the registry every
// registryRefresh.
type registryStack struct {
	*harness.Stack
	chain  *devchain.Chain
	client *harness.Client
}

func newRegistryStack(t *testing.T) *registryStack {
	t.Helper()
	ctx := context.Background()
	const devnetChainID = 31337
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, ChainID: devnetChainID})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })

	s := harness.NewStack(t)
	// A network of its own, added the operator's way before start (the
	// worker checks its RPC's chain id against it).
	out, code := s.Settlectl("networks", "add", "--name", "DEVNET", "--chain-id", strconv.Itoa(devnetChainID), "--native", "ETH", "--decimals", "18")
	require.Equal(t, 0, code, out)
	for k, v := range map[string]string{
		"NETWORKS":             "DEVNET",
		"RPC_URL_DEVNET":       ch.URL(),
		"DEPOSIT_FINALITY":     "confirmations:1",
		"REGISTRY_REFRESH":     registryRefresh.String(),
		"POLL_INTERVAL":        "200ms",
		"FINALITY_RECHECK_MIN": "100ms",
		"FINALITY_RECHECK_MAX": "500ms",
		"FINALITY_HINT_TTL":    "50ms",
		"REORG_WATCH_INTERVAL": "300ms",
		"SCAN_INTERVAL":        "off",
	} {
		s.Env[k] = v
	}
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	client := harness.NewClient(api.URL())
	createUsers(t, client, 1)
	status, body, err := client.Admin(http.MethodPost, "/admin/deposit-addresses", map[string]any{"address": addrUser1, "network": "DEVNET", "user_id": 1})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)

	return &registryStack{Stack: s, chain: ch, client: client}
}

// TestAssetAddedToRunningProcessesIsCredited is issue 14's acceptance: an
// asset added with `settlectl assets add` while api, worker and scheduler
// run is credited within REGISTRY_REFRESH, without a restart. The token is
// deployed on a simulated chain after the processes started, and the
// worker checks the deposit against that chain (the token's Transfer log
// found by the contract the new listing names), so every process that
// touches the deposit had to learn the listing.
func TestAssetAddedToRunningProcessesIsCredited(t *testing.T) {
	ctx := context.Background()
	r := newRegistryStack(t)
	s, ch, client := r.Stack, r.chain, r.client

	// A token nobody has listed yet, and a transfer of 5.25 of it (six
	// decimals) to user 1.
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	tx, err := ch.TransferToken(ctx, 0, token, addrUser1, big.NewInt(5_250_000))
	require.NoError(t, err)
	require.NoError(t, ch.CommitBlocks(ctx, 2))
	deposit, _ := json.Marshal(map[string]any{
		"event_id": "newt-1", "event_type": "deposit", "user_id": 1, "asset": "NEWT", "amount": "5.25",
		"network": "DEVNET", "tx_hash": tx.Hash,
	})
	status, body, err := client.Webhook(deposit)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, status, "before the listing, NEWT is unknown: %v", body)
	require.Equal(t, "unknown_asset", body["code"])

	// The token's checksummed address: the listing is stored lowercase.
	out, code := s.Settlectl("assets", "add", "--network", "DEVNET", "--asset", "NEWT", "--contract", token, "--decimals", "6")
	require.Equal(t, 0, code, out)
	added := time.Now()
	// Running it again changes nothing; listing the code otherwise there
	// is refused.
	out, code = s.Settlectl("assets", "add", "--network", "DEVNET", "--asset", "NEWT", "--contract", token, "--decimals", "6")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "as given")
	out, code = s.Settlectl("assets", "add", "--network", "DEVNET", "--asset", "NEWT", "--contract", token, "--decimals", "18")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "conflict")

	// The provider retries a refused delivery; it is accepted once the
	// api has read the listing.
	deadline := added.Add(2*registryRefresh + 5*time.Second)
	for {
		status, body, err = client.Webhook(deposit)
		require.NoError(t, err)
		if status == http.StatusOK {
			break
		}
		require.Equal(t, "unknown_asset", body["code"], body)
		require.True(t, time.Now().Before(deadline), "the api still refuses NEWT %s after the listing", time.Since(added))
		time.Sleep(100 * time.Millisecond)
	}
	accepted := time.Since(added)

	r.requireConfirmed(t, "newt-1")
	credited := time.Since(added)
	t.Logf("NEWT listed; api accepted the deposit %s later, credited %s after the listing (REGISTRY_REFRESH %s)", accepted.Round(time.Millisecond), credited.Round(time.Millisecond), registryRefresh)
	// Within a few refresh periods, plus the confirmation wait.
	require.Less(t, credited, 3*registryRefresh+10*time.Second)

	var balance, journalAmount, journalNetwork string
	require.NoError(t, s.DB.QueryRow(ctx, `SELECT balance::text FROM balances WHERE user_id = 1 AND asset = 'NEWT'`).Scan(&balance))
	require.Equal(t, "5.25", strings.TrimRight(strings.TrimRight(balance, "0"), "."))
	require.NoError(t, s.DB.QueryRow(ctx,
		`SELECT amount::text, network FROM balance_events WHERE source_event_id = 'newt-1' AND event_type = 'deposit' AND user_id = 1 AND asset = 'NEWT'`).
		Scan(&journalAmount, &journalNetwork))
	require.Equal(t, "5.25", strings.TrimRight(strings.TrimRight(journalAmount, "0"), "."))
	require.Equal(t, "DEVNET", journalNetwork, "the journal row names the network")
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'newt-1'`))

	out, code = s.Settlectl("assets", "list", "--network", "DEVNET")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, strings.ToLower(token))
	out, code = s.Settlectl("networks", "list")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `DEVNET\s+31337\s+ETH`, out)
	// Operator typos are usage errors (exit 2), named.
	for _, args := range [][]string{
		{"assets", "add", "--network", "DEVNET", "--asset", "newt", "--decimals", "6"},
		{"assets", "add", "--network", "DEVNETT", "--asset", "NEWV", "--decimals", "6"},
		{"assets", "add", "--network", "DEVNET", "--asset", "NEWV", "--contract", token},
		{"networks", "add", "--name", "OTHER", "--chain-id", "0", "--native", "ETH", "--decimals", "18"},
	} {
		out, code = s.Settlectl(args...)
		require.Equal(t, 2, code, "%v: %s", args, out)
	}
	out, code = s.Settlectl("check")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "NEWT on DEVNET")
	requireInvariants(t, s)
}

// requireConfirmed waits for the event to end and requires it confirmed.
func (r *registryStack) requireConfirmed(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	var status string
	r.WaitFor(id+" terminal", 2*registryRefresh+30*time.Second, func() bool {
		require.NoError(t, r.DB.QueryRow(ctx, `SELECT status FROM payment_events WHERE event_id = $1`, id).Scan(&status))
		return status == "confirmed" || status == "failed"
	})
	var outcome, reason *string
	require.NoError(t, r.DB.QueryRow(ctx, `SELECT outcome, error FROM payment_events WHERE event_id = $1`, id).Scan(&outcome, &reason))
	require.Equal(t, "confirmed", status, "outcome %v, reason %v", deref(outcome), deref(reason))
}

// TestAssetListedThroughTheAPIReachesTheWorker: POST /admin/assets makes
// the api accept the asset's deposits at once, while the worker learns the
// listing only at its next REGISTRY_REFRESH. A deposit sent the moment the
// listing is added must still be credited, not refused by a worker that
// has not reread the tables yet.
func TestAssetListedThroughTheAPIReachesTheWorker(t *testing.T) {
	ctx := context.Background()
	r := newRegistryStack(t)
	token, _, err := r.chain.DeployToken(ctx, 0)
	require.NoError(t, err)
	tx, err := r.chain.TransferToken(ctx, 0, token, addrUser1, big.NewInt(7_000_000))
	require.NoError(t, err)
	require.NoError(t, r.chain.CommitBlocks(ctx, 2))

	status, body, err := r.client.Admin(http.MethodPost, "/admin/assets", map[string]any{"network": "DEVNET", "asset": "NEWU", "contract": token, "decimals": 6})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, body)
	added := time.Now()
	deposit, _ := json.Marshal(map[string]any{
		"event_id": "newu-1", "event_type": "deposit", "user_id": 1, "asset": "NEWU", "amount": "7",
		"network": "DEVNET", "tx_hash": tx.Hash,
	})
	status, body, err = r.client.Webhook(deposit)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "the api that took the listing knows it at once: %v", body)

	r.requireConfirmed(t, "newu-1")
	t.Logf("NEWU listed through the api; credited %s later (REGISTRY_REFRESH %s)", time.Since(added).Round(time.Millisecond), registryRefresh)
	require.Equal(t, 1, r.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = 'newu-1' AND network = 'DEVNET' AND amount = 7`))
	requireInvariants(t, r.Stack)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
