package finality_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// outageChain is a network whose RPC cannot be asked at all.
type outageChain struct{ downChain }

func (outageChain) CheckDeposit(context.Context, chain.Deposit, chain.Policy) (chain.Verdict, error) {
	return chain.Verdict{}, payment.Unavailable("chain", errors.New("breaker open"))
}

// finalLater answers "not final yet" until final is set, then "final".
type finalLater struct {
	waitingChain
	final atomic.Bool
}

func (c *finalLater) CheckDeposit(ctx context.Context, d chain.Deposit, p chain.Policy) (chain.Verdict, error) {
	if !c.final.Load() {
		return c.waitingChain.CheckDeposit(ctx, d, p)
	}
	return chain.Verdict{State: chain.Credit, Finalized: true, ReceiptSeen: true, BlockNumber: 7, BlockHash: "0xb7",
		Transfers: []string{payment.TransferNative}}, nil
}

// TestRecheckGivesEachNetworkItsTurn: ETH_MAINNET's RPC is down with
// three claims' worth of deposits due before BASE_MAINNET's one; BASE's
// is re-checked, and credited, in the first claim (it waited behind
// every ETH re-check: with thousands waiting, many minutes a check).
func TestRecheckGivesEachNetworkItsTurn(t *testing.T) {
	const dueMax = 20
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	assets, err := db.Assets(ctx)
	require.NoError(t, err)
	base := &finalLater{}
	gate := finality.New(finality.Options{
		Store: db, Assets: assets, Alerts: noAlerts{}, Log: zerolog.Nop(),
		RecheckFirst: time.Minute, RecheckMax: time.Hour,
		Networks: map[string]finality.NetworkChain{
			"ETH_MAINNET":  {Chain: outageChain{}, Policy: chain.FinalizedPolicy()},
			"BASE_MAINNET": {Chain: base, Policy: chain.FinalizedPolicy()},
		},
	})

	// pass claims what is due, as the enqueuer does, and runs the gate on
	// it, as a worker does: it returns the ids it claimed.
	pass := func(pendingMax, dueMax int) []string {
		t.Helper()
		claimed, err := db.ClaimOutbox(ctx, pendingMax, dueMax, postgres.TaskEventsMax)
		require.NoError(t, err)
		var ids []string
		for _, c := range claimed {
			ids = append(ids, c.Event.ID)
			credit, err := gate.Check(ctx, postgres.LedgerItem{Event: c.Event})
			require.NoError(t, err)
			if credit != nil {
				_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{*credit}, postgres.LedgerOptions{})
				require.NoError(t, err)
			}
		}
		return ids
	}
	deposit := func(id, network string, n int) {
		t.Helper()
		e := payment.Event{ID: id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
			TxHash: fmt.Sprintf("0x%064x", n), TraceID: "trace-" + id, Network: network}
		inserted, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
		require.True(t, inserted)
	}

	for i := range 3 * dueMax {
		deposit(fmt.Sprintf("eth-%d", i), "ETH_MAINNET", 0x1000+i)
	}
	require.Len(t, pass(postgres.OutboxClaimMax-dueMax, 0), 3*dueMax, "ETH's deposits wait: its chain cannot be asked")
	deposit("base-0", "BASE_MAINNET", 0x9000)
	require.Equal(t, []string{"base-0"}, pass(10, 0))
	// Every deposit is due, BASE's last.
	_, err = conn.Exec(ctx, `UPDATE payment_events SET next_check_at = now() - interval '1 hour'
		+ CASE WHEN network = 'BASE_MAINNET' THEN interval '1 minute' ELSE interval '0' END
		WHERE status = 'awaiting_finality'`)
	require.NoError(t, err)
	base.final.Store(true)

	first := pass(0, dueMax)
	require.Len(t, first, dueMax)
	require.Contains(t, first, "base-0", "BASE's deposit is re-checked in the first claim, ETH's outage notwithstanding")
	v, err := db.Event(ctx, "base-0")
	require.NoError(t, err)
	require.Equal(t, payment.StatusConfirmed, v.Status, "and credited")

	// ETH's deposits asked in vain wait again, behind the others, on the
	// growing schedule.
	var waiting, behind int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE next_check_at > now() + interval '1 minute')
		FROM payment_events WHERE status = 'awaiting_finality' AND check_count = 2`).Scan(&waiting, &behind))
	require.Equal(t, dueMax-1, waiting)
	require.Equal(t, dueMax-1, behind)
}
