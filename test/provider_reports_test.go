package test

import (
	"context"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/postgres"
)

// TestProviderReportsAndMisses: every provider that reports a transfer
// is recorded with its first time (the event's source is the first), and
// the scheduler's gauge counts, per provider, the transfer deposits it
// never reported.
func TestProviderReportsAndMisses(t *testing.T) {
	c := newChainStack(t, "confirmations:1", map[string]string{
		"QUICKNODE_SECURITY_TOKEN": quickNodeToken,
		"MORALIS_STREAM_SECRET":    moralisSecret,
		"PROVIDER_MISS_GRACE":      "1ms",
		"PROVIDER_MISS_INTERVAL":   "200ms",
	})
	ctx := context.Background()
	viaAlchemy := func(tx devchain.Tx) {
		status, answer := c.alchemy(t, alchemyETHPayload(addrUser1, tx, "0xde0b6b3a7640000"))
		require.Equal(t, http.StatusOK, status, answer)
	}
	viaQuickNode := func(tx devchain.Tx) {
		status, answer := c.quickNode(t, c.quickNodeBlock(t, tx), time.Now(), quickNodeToken, false)
		require.Equal(t, http.StatusOK, status, answer)
	}
	viaMoralis := func(tx devchain.Tx) {
		compact, spaced := moralisDelivery(tx, "", addrUser1, "1000000000000000000", true)
		status, answer := c.moralisSigned(t, compact, spaced)
		require.Equal(t, http.StatusOK, status, answer)
	}

	// One transfer seen by QuickNode first, then Alchemy, then QuickNode
	// again; one seen by Moralis alone; one by Alchemy and Moralis.
	var txs []devchain.Tx
	for range 3 {
		tx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(1))
		require.NoError(t, err)
		txs = append(txs, tx)
	}
	viaQuickNode(txs[0])
	time.Sleep(20 * time.Millisecond)
	viaAlchemy(txs[0])
	viaQuickNode(txs[0])
	viaMoralis(txs[1])
	viaAlchemy(txs[2])
	viaMoralis(txs[2])

	id := func(tx devchain.Tx) string { return "chain:ETH_MAINNET:" + tx.Hash + ":native" }
	reporters := func(tx devchain.Tx) []string {
		rows, err := c.DB.Query(ctx, `SELECT reporter FROM transfer_reports WHERE event_id = $1 ORDER BY first_at, reporter`, id(tx))
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var r string
			require.NoError(t, rows.Scan(&r))
			out = append(out, r)
		}
		return out
	}
	require.Equal(t, []string{"quicknode", "alchemy"}, reporters(txs[0]), "first QuickNode, then Alchemy; the repeat keeps QuickNode's first time")
	require.Equal(t, []string{"moralis"}, reporters(txs[1]))
	require.ElementsMatch(t, []string{"alchemy", "moralis"}, reporters(txs[2]))
	for _, tx := range txs {
		c.waitStatus(t, id(tx), "confirmed")
	}

	// The storage's sample: QuickNode missed two of three, Alchemy and
	// Moralis one each.
	db, err := postgres.Open(ctx, c.DatabaseURL, postgres.Options{ConnsMax: 2})
	require.NoError(t, err)
	defer db.Close()
	misses, err := db.ProviderMisses(ctx, 1000, time.Millisecond)
	require.NoError(t, err)
	got := map[string][2]int64{}
	for _, m := range misses {
		got[m.Reporter] = [2]int64{m.Missed, m.Sampled}
	}
	require.Equal(t, map[string][2]int64{"alchemy": {1, 3}, "moralis": {1, 3}, "quicknode": {2, 3}}, got)

	// The scheduler's gauge says the same.
	var scheduler string
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "scheduler") {
			scheduler = p.URL()
		}
	}
	c.WaitFor("provider miss gauges", 30*time.Second, func() bool {
		return metricValue(scheduler, `settle_provider_missed_deposits{provider="quicknode"}`) == 2 &&
			metricValue(scheduler, `settle_provider_missed_deposits{provider="alchemy"}`) == 1 &&
			metricValue(scheduler, `settle_provider_sampled_deposits{provider="moralis"}`) == 3
	})
}

// permutations lists every order of names.
func permutations(names []string) [][]string {
	if len(names) <= 1 {
		return [][]string{append([]string(nil), names...)}
	}
	var out [][]string
	for i, first := range names {
		rest := append(append([]string(nil), names[:i]...), names[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{first}, p...))
		}
	}
	return out
}

// TestOneTransferThreeProvidersAndTheScanner: one real transfer (ETH and a
// token) reported by Alchemy, QuickNode and Moralis and found by the
// scanner, in every one of the 24 orders: one payment_events row, one
// credit; the first reporter stores it (the scanner's source is
// "scanner"), every later one is a duplicate (the scanner counts it
// "reported").
func TestOneTransferThreeProvidersAndTheScanner(t *testing.T) {
	// A transaction is final three blocks deep, so the webhooks ahead of
	// the scanner can deliver before its block is final; the scanner,
	// following head − 3, finds it once three more blocks are sealed.
	c := newChainStack(t, "confirmations:3", map[string]string{
		"QUICKNODE_SECURITY_TOKEN": quickNodeToken,
		"MORALIS_STREAM_SECRET":    moralisSecret,
		"SCAN_INTERVAL":            "200ms",
	})
	ctx := context.Background()
	scannedPast := func(block uint64) bool { return c.cursor(t) > int64(block) }
	// The scanner starts at the finality head when it first runs (three
	// blocks deep: there must be that many).
	require.NoError(t, c.chain.CommitBlocks(ctx, 3))
	c.WaitFor("the scanner's cursor", time.Minute, func() bool { return c.cursor(t) >= 0 })

	deliver := map[string]func(tx devchain.Tx, token bool) map[string]any{
		"alchemy": func(tx devchain.Tx, token bool) map[string]any {
			payload := alchemyETHPayload(addrUser1, tx, "0xde0b6b3a7640000")
			if token {
				payload = alchemyTokenPayload(c.token, addrUser1, tx, "0xf4240", false)
			}
			status, answer := c.alchemy(t, payload)
			require.Equal(t, http.StatusOK, status, answer)
			return answer
		},
		"quicknode": func(tx devchain.Tx, _ bool) map[string]any {
			status, answer := c.quickNode(t, c.quickNodeBlock(t, tx), time.Now(), quickNodeToken, false)
			require.Equal(t, http.StatusOK, status, answer)
			return answer
		},
		"moralis": func(tx devchain.Tx, token bool) map[string]any {
			compact, spaced := moralisDelivery(tx, "", addrUser1, "1000000000000000000", true)
			if token {
				compact, spaced = moralisDelivery(tx, c.token, addrUser1, "1000000", true)
			}
			status, answer := c.moralisSigned(t, compact, spaced)
			require.Equal(t, http.StatusOK, status, answer)
			return answer
		},
	}
	orders := permutations([]string{"alchemy", "quicknode", "moralis", "scanner"})
	require.Len(t, orders, 24)
	var ids []string
	for _, order := range orders {
		for _, token := range []bool{false, true} {
			var tx devchain.Tx
			var err error
			id := ""
			if token {
				tx, err = c.chain.TransferToken(ctx, 0, c.token, addrUser1, big.NewInt(1_000_000))
				id = "chain:ETH_MAINNET:" + tx.Hash + ":0"
			} else {
				tx, err = c.chain.SendETH(ctx, 0, addrUser1, wei(1))
				id = "chain:ETH_MAINNET:" + tx.Hash + ":native"
			}
			require.NoError(t, err)
			ids = append(ids, id)
			for i, name := range order {
				if name == "scanner" {
					require.NoError(t, c.chain.CommitBlocks(ctx, 3))
					c.WaitFor("the scanner past block "+fmt.Sprint(tx.BlockNumber), time.Minute, func() bool { return scannedPast(tx.BlockNumber) })
					continue
				}
				answer := deliver[name](tx, token)
				if i == 0 {
					requireCounts(t, answer, 1, 0)
				} else {
					requireCounts(t, answer, 0, 1)
				}
			}
			require.Equal(t, 1, c.Count(`SELECT count(*) FROM payment_events WHERE tx_hash = $1`, tx.Hash), "%v token=%v", order, token)
			var source string
			require.NoError(t, c.DB.QueryRow(ctx, `SELECT source FROM payment_events WHERE event_id = $1`, id).Scan(&source))
			require.Equal(t, order[0], source, "%v token=%v: the first reporter stored it", order, token)
		}
	}
	for _, id := range ids {
		c.waitStatus(t, id, "confirmed")
	}
	require.Equal(t, len(ids), c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, len(ids), c.Count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	require.Equal(t, len(ids), c.Count(`SELECT count(*) FROM chain_transfers`))
	require.Equal(t, strconv.Itoa(len(orders)), c.balance(t, 1, "ETH"))
	require.Equal(t, strconv.Itoa(len(orders)), c.balance(t, 1, "TUSD"))
	// The scanner stored the transfers it reached first and found the
	// others already reported.
	var scheduler string
	for _, p := range c.Procs {
		if strings.HasPrefix(p.Name, "scheduler") {
			scheduler = p.URL()
		}
	}
	// A pass counts its deposits after its commit moved the cursor.
	require.Eventually(t, func() bool {
		return metricValue(scheduler, `settle_scan_deposits_total{network="ETH_MAINNET",source="scanner"}`) == 12 &&
			metricValue(scheduler, `settle_scan_deposits_total{network="ETH_MAINNET",source="reported"}`) == 36
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, float64(12), metricValue(scheduler, `settle_scan_deposits_total{network="ETH_MAINNET",source="scanner"}`))
	require.Equal(t, float64(36), metricValue(scheduler, `settle_scan_deposits_total{network="ETH_MAINNET",source="reported"}`))
	requireInvariants(t, c.Stack)
}
