package test

import (
	"context"
	"net/http"
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
