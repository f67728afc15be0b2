package intake_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	mainnet  = "ETH_MAINNET"
	polygon  = "MATIC_MAINNET"
	alice    = int64(7)
	aliceETH = "0x00000000000000000000000000000000000a11ce"
	stranger = "0x000000000000000000000000000000000000dead"
)

var provider = intake.Provider{Name: "alchemy", Source: postgres.SourceAlchemy}

// counts records what the intake told the webhook metric.
type counts struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *counts) count(provider, outcome string, reason payment.IgnoreReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[provider+"/"+outcome+"/"+string(reason)]++
}

func (c *counts) get(outcome string, reason payment.IgnoreReason) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen["alchemy/"+outcome+"/"+string(reason)]
}

type fixture struct {
	t      *testing.T
	db     *postgres.DB
	counts *counts
	eth    payment.Asset
}

// setup gives alice a deposit address on mainnet; mainnet alone is
// enabled (polygon is known to the database, not to this api).
func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	db := testenv.DB(t)
	_, err := db.CreateUser(ctx, alice)
	require.NoError(t, err)
	_, err = db.AddDepositAddress(ctx, mainnet, aliceETH, alice)
	require.NoError(t, err)
	registry, err := db.Assets(ctx)
	require.NoError(t, err)
	eth, ok := registry.Native(mainnet)
	require.True(t, ok)
	return &fixture{t: t, db: db, counts: &counts{seen: map[string]int{}}, eth: eth}
}

func (f *fixture) intake(rpc bool) *intake.Intake {
	return intake.New(intake.Options{
		Store:          f.db,
		NetworkEnabled: func(n string) bool { return n == mainnet },
		HasRPC:         func(string) bool { return rpc },
		Count:          f.counts.count,
	})
}

func (f *fixture) transfer(n int, to, amount string) payment.ReportedTransfer {
	return payment.ReportedTransfer{
		Transfer:  payment.Transfer{Network: mainnet, TxHash: fmt.Sprintf("0x%064x", n), Index: payment.TransferNative},
		ToAddress: to, Asset: f.eth, Amount: decimal.RequireFromString(amount),
	}
}

func (f *fixture) deliver(in *intake.Intake, transfers ...payment.ReportedTransfer) intake.Answer {
	f.t.Helper()
	run := in.Start(provider, "trace-1")
	require.NoError(f.t, run.Store(context.Background(), transfers))
	return run.Answer()
}

func (f *fixture) event(id string) postgres.EventView {
	f.t.Helper()
	e, err := f.db.Event(context.Background(), id)
	require.NoError(f.t, err)
	return e
}

// TestOneTransferOneDeposit: a transfer to a deposit address is stored
// once, as its owner's deposit under the transfer identity's id, whoever
// reports it and however often.
func TestOneTransferOneDeposit(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	tr := f.transfer(1, aliceETH, "0.5")

	answer := f.deliver(in, tr)
	require.Equal(t, intake.Answer{Status: "accepted", Accepted: 1, TraceID: "trace-1"}, answer)
	e := f.event(tr.EventID())
	require.Equal(t, alice, e.UserID, "the owner comes from deposit_addresses")
	require.Equal(t, payment.Deposit, e.Type)
	require.Equal(t, string(postgres.SourceAlchemy), e.Source)
	require.True(t, decimal.RequireFromString("0.5").Equal(e.Amount))

	// A redelivery, and a second copy in one delivery, are duplicates.
	answer = f.deliver(in, tr, tr)
	require.Equal(t, 0, answer.Accepted)
	require.Equal(t, 2, answer.Duplicates)
	require.Equal(t, 1, f.counts.get(intake.OutcomeAccepted, ""))
	require.Equal(t, 2, f.counts.get(intake.OutcomeDuplicate, ""))
}

// TestTransfersThatAreNoDeposit: each is ignored with its reason and
// stores nothing; the rest of the delivery is stored.
func TestTransfersThatAreNoDeposit(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	stored := f.transfer(1, aliceETH, "1")
	f.deliver(in, stored)

	otherNetwork := f.transfer(2, aliceETH, "1")
	otherNetwork.Network = polygon
	unknown := f.transfer(3, stranger, "1")
	conflict := stored
	conflict.Amount = decimal.RequireFromString("2") // same transfer, other content
	good := f.transfer(4, aliceETH, "3")

	answer := f.deliver(in, otherNetwork, unknown, conflict, good)
	require.Equal(t, 3, answer.Ignored)
	require.Equal(t, 1, answer.Accepted)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonNetworkDisabled))
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonUnknownAddress))
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonConflict))
	require.True(t, decimal.RequireFromString("1").Equal(f.event(stored.EventID()).Amount), "a conflict never overwrites")
	for _, tr := range []payment.ReportedTransfer{otherNetwork, unknown} {
		_, err := f.db.Event(context.Background(), tr.EventID())
		require.ErrorIs(t, err, payment.ErrNotFound)
	}
	f.event(good.EventID())
}

// TestOwnerOnTheTransfersNetwork: an address is an owner's on one network
// only; the same address on another enabled network is nobody's.
func TestOwnerOnTheTransfersNetwork(t *testing.T) {
	f := setup(t)
	in := intake.New(intake.Options{Store: f.db, NetworkEnabled: func(string) bool { return true }, Count: f.counts.count})
	registry, err := f.db.Assets(context.Background())
	require.NoError(t, err)
	pol, ok := registry.Native(polygon)
	require.True(t, ok)
	tr := f.transfer(1, aliceETH, "1")
	tr.Network, tr.Asset = polygon, pol
	answer := f.deliver(in, tr)
	require.Equal(t, 0, answer.Accepted)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonUnknownAddress))
}

// TestRemovedWithoutAChain: where the chain cannot be asked, a provider's
// removal is the evidence and the deposit is reversed; a removal of what
// settle never stored is ignored.
func TestRemovedWithoutAChain(t *testing.T) {
	f := setup(t)
	in := f.intake(false)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(in, tr)

	removed := tr
	removed.Removed = true
	never := f.transfer(2, aliceETH, "1")
	never.Removed = true
	answer := f.deliver(in, removed, never)
	require.Equal(t, 1, answer.Reversed)
	require.Equal(t, 1, answer.Ignored)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonRemovedUnknown))
	require.Equal(t, payment.StatusFailed, f.event(tr.EventID()).Status, "a deposit not credited yet is voided")

	// Reported again after the reorg: reopened for the ledger.
	answer = f.deliver(in, tr)
	require.Equal(t, 1, answer.Duplicates)
	require.Equal(t, 1, answer.Reopened)
}

// TestRemovedWithAChain: where the chain can be asked, a removal hands the
// deposit to it and reverses nothing; a transfer sent again on a reorg's
// new branch is stored like any other.
func TestRemovedWithAChain(t *testing.T) {
	f := setup(t)
	in := f.intake(true)
	tr := f.transfer(1, aliceETH, "1")
	f.deliver(in, tr)

	removed := tr
	removed.Removed = true
	answer := f.deliver(in, removed)
	require.Equal(t, 1, answer.Rechecked)
	require.Equal(t, 0, answer.Reversed)
	require.NotEqual(t, payment.StatusFailed, f.event(tr.EventID()).Status, "the report alone reverses nothing")

	reorged := f.transfer(2, aliceETH, "2")
	reorged.Removed, reorged.Reorged = true, true
	answer = f.deliver(in, reorged)
	require.Equal(t, 1, answer.Accepted, "a transfer on the new branch is stored; the gate asks the chain before any credit")

	// Without a chain the same report is a removal of something unknown.
	again := f.transfer(3, aliceETH, "2")
	again.Removed, again.Reorged = true, true
	answer = f.deliver(f.intake(false), again)
	require.Equal(t, 0, answer.Accepted)
	require.Equal(t, 1, f.counts.get(intake.OutcomeIgnored, intake.ReasonRemovedUnknown))
}
