package finality_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// downChain is a network whose RPC breaker is open.
type downChain struct{ waitingChain }

func (downChain) StillCanonical(context.Context, chain.Deposit, uint64, string) (chain.Canonicity, error) {
	return chain.Canonicity{}, payment.Unavailable("chain", errors.New("breaker open"))
}

// creditOn credits n watched 1-ETH deposits on network, in batches.
func creditOn(t *testing.T, f *watchFixture, network, prefix string, base, n int) {
	t.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		k := min(32, n-done)
		for i := 0; i < k; i++ {
			id := fmt.Sprintf("%s-%d", prefix, done+i)
			e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
				TxHash: fmt.Sprintf("0x%064x", base+done+i), TraceID: "trace-" + id, Network: network}
			ins, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
			require.NoError(t, err)
			require.True(t, ins)
		}
		claimed, err := f.db.ClaimOutbox(ctx, k, 0, postgres.TaskEventsMax)
		require.NoError(t, err)
		require.Len(t, claimed, k)
		var items []postgres.LedgerItem
		for _, c := range claimed {
			items = append(items, postgres.LedgerItem{Event: c.Event, Chain: &postgres.ChainEvidence{
				BlockNumber: 7, BlockHash: blockHash(7), Watch: true, Transfers: []string{payment.TransferNative}}})
		}
		results, err := f.db.ApplyBatch(ctx, items, postgres.LedgerOptions{})
		require.NoError(t, err)
		for _, r := range results {
			require.Equal(t, payment.StatusConfirmed, r.Status)
		}
		done += k
	}
}

// gateOn is a gate asking only networks.
func gateOn(f *watchFixture, networks map[string]finality.NetworkChain) *finality.Gate {
	assets, err := f.db.Assets(context.Background())
	require.NoError(f.t, err)
	return finality.New(finality.Options{
		Store: f.db, Networks: networks, Assets: assets, Policy: chain.FinalizedPolicy(),
		ReorgRecheckDelay: time.Millisecond, Alerts: noAlerts{}, Log: zerolog.Nop(),
	})
}

// TestWatchSkipsNetworksItCannotAsk: a network taken out of NETWORKS (or
// served by no RPC in this worker) with WatchBatchMax watched deposits
// takes no share of a pass: the first pass asks about the BASE deposit
// the chain shows gone (the watch read the same 500 other rows forever).
func TestWatchSkipsNetworksItCannotAsk(t *testing.T) {
	f := newWatchFixture(t, time.Millisecond)
	creditOn(t, f, "ETH_MAINNET", "eth", 0x1000, finality.WatchBatchMax)
	creditOn(t, f, "BASE_MAINNET", "base", 0x9000, 1)
	baseTx := fmt.Sprintf("0x%064x", 0x9000)
	f.chain.set(baseTx, chain.Canonicity{State: chain.Gone, Reason: "block 7 replaced"}, nil)

	// ETH_MAINNET was taken out of NETWORKS: this worker has BASE only.
	g := gateOn(f, map[string]finality.NetworkChain{"BASE_MAINNET": {Chain: f.chain, Policy: chain.FinalizedPolicy()}})
	require.NoError(t, g.WatchReorgs(context.Background()))
	asked := f.chain.takeAsked()
	require.NotEmpty(t, asked)
	for _, tx := range asked {
		require.Equal(t, baseTx, tx, "BASE's deposit, and no other network's")
	}
	require.Equal(t, 1, f.compensations("base-0"), "the BASE deposit the chain shows gone is compensated")
}

// TestWatchGivesEachNetworkItsTurn: ETH_MAINNET enabled with its RPC
// down and more rows than a pass takes: the first pass still watches
// BASE_MAINNET (one network's outage stopped every other's watch).
func TestWatchGivesEachNetworkItsTurn(t *testing.T) {
	f := newWatchFixture(t, time.Millisecond)
	creditOn(t, f, "ETH_MAINNET", "eth", 0x1000, finality.WatchBatchMax+20)
	creditOn(t, f, "BASE_MAINNET", "base", 0x9000, 1)
	baseTx := fmt.Sprintf("0x%064x", 0x9000)
	f.chain.set(baseTx, chain.Canonicity{State: chain.Gone, Reason: "block 7 replaced"}, nil)

	g := gateOn(f, map[string]finality.NetworkChain{
		"ETH_MAINNET":  {Chain: downChain{}, Policy: chain.FinalizedPolicy()},
		"BASE_MAINNET": {Chain: f.chain, Policy: chain.FinalizedPolicy()},
	})
	err := g.WatchReorgs(context.Background())
	require.ErrorIs(t, err, payment.ErrUnavailable, "ETH's outage is reported")
	require.Contains(t, f.chain.takeAsked(), baseTx)
	require.Equal(t, 1, f.compensations("base-0"), "the BASE deposit the chain shows gone is compensated")
}
