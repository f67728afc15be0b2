package test

import (
	"context"
	"flag"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	flagLatencyDeposits = flag.Int("scanlatency.deposits", 10, "deposits TestScannerFinalityToCredit makes (BENCHMARKS.md: 50)")
	flagLatencyInterval = flag.Duration("scanlatency.interval", time.Second, "SCAN_INTERVAL of TestScannerFinalityToCredit")
)

// TestScannerFinalityToCredit measures, for deposits only the scanner
// finds (no webhook at all), the time from their block becoming final to
// their event being stored and confirmed, and logs p50/p99
// (BENCHMARKS.md, "Chain scanner"). SCAN_INTERVAL bounds it from below:
// a block finalized just after a pass waits for the next one. Deposits
// come at a pace that is not a multiple of the interval, so they land at
// every phase of the scanner's ticker; each waits a pace mined but not
// final first. It fails if a deposit is stored before its block is final,
// is not credited, or is credited twice.
func TestScannerFinalityToCredit(t *testing.T) {
	interval := *flagLatencyInterval
	c := newChainStack(t, "finalized", map[string]string{"SCAN_INTERVAL": interval.String(), "SCAN_PASS_TIMEOUT": "10s"})
	ctx := context.Background()
	c.WaitFor("the scanner's first run", time.Minute, func() bool { return c.cursor(t) >= 0 })

	pace := interval * 13 / 10
	type deposit struct {
		id    string
		final time.Time
	}
	var deposits []deposit
	next := time.Now()
	for i := range *flagLatencyDeposits {
		next = next.Add(pace)
		var id string
		var block uint64
		if i%2 == 0 {
			tx, err := c.chain.TransferToken(ctx, 0, c.token, addrUser2, big.NewInt(1_000_000))
			require.NoError(t, err)
			id, block = tokenID(tx), tx.BlockNumber
		} else {
			tx, err := c.chain.SendETH(ctx, 0, addrUser1, wei(1))
			require.NoError(t, err)
			id, block = nativeID(tx), tx.BlockNumber
		}
		// Mined, not final, for a pace (a pass or more): nothing is stored.
		time.Sleep(time.Until(next))
		require.Zero(t, c.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1`, id), "%s stored before its block was final", id)
		// Timed before the call: the block is final once the chain has
		// taken it, and a scanner pass may store the deposit before this
		// goroutine runs again (seconds later on a loaded machine).
		asked := time.Now()
		require.NoError(t, c.chain.FinalizeThrough(ctx, block))
		deposits = append(deposits, deposit{id, asked})
	}
	var stored, credited []time.Duration
	for _, d := range deposits {
		c.waitCredited(t, d.id)
		var created, updated time.Time
		var source string
		require.NoError(t, c.DB.QueryRow(ctx, `SELECT created_at, updated_at, source FROM payment_events WHERE event_id = $1 AND status = 'confirmed'`, d.id).
			Scan(&created, &updated, &source))
		require.Equal(t, "scanner", source, d.id)
		require.False(t, created.Before(d.final), "%s stored %s before its block was final", d.id, d.final.Sub(created))
		stored = append(stored, created.Sub(d.final))
		credited = append(credited, updated.Sub(d.final))
	}
	require.Equal(t, len(deposits), c.Count(`SELECT count(*) FROM payment_events`))
	require.Equal(t, len(deposits), c.Count(`SELECT count(*) FROM balance_events`), "each credited once")
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("finality to stored (scanner-only deposits, n=%d, SCAN_INTERVAL=%s, one every %s): %s", len(stored), interval, pace, percentiles(stored))
	t.Logf("finality to credited (confirmed): %s", percentiles(credited))
	t.Logf("load average %s", strings.Join(strings.Fields(string(load))[:3], " "))
	requireInvariants(t, c.Stack)
}

// percentiles is "p50 X p99 Y max Z" of ds (nearest rank).
func percentiles(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("p50 %s p99 %s max %s", ms(rank(0.50)), ms(rank(0.99)), ms(rank(1)))
}
