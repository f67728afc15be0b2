package invariant_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

func settleOn(t *testing.T, db *postgres.DB, id string, typ payment.EventType, network, amount string) {
	t.Helper()
	ctx := context.Background()
	e := payment.Event{ID: id, Type: typ, UserID: 1, Asset: "USDC", Amount: decimal.RequireFromString(amount), Network: network}
	_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e})
	require.NoError(t, err)
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: claimed[0].Event}}, postgres.LedgerOptions{})
	require.NoError(t, err)
}

// Conservation is one sheet per asset (a USDC balance is one, wherever it
// was deposited) and it reports what each network brought and took.
func TestConservationPerNetwork(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	settleOn(t, db, "base-1", payment.Deposit, "BASE_MAINNET", "30")
	settleOn(t, db, "eth-1", payment.Deposit, "ETH_MAINNET", "5.5")
	settleOn(t, db, "arb-1", payment.Deposit, "ARB_MAINNET", "1.25")
	settleOn(t, db, "base-w", payment.Withdrawal, "BASE_MAINNET", "2")
	settleOn(t, db, "eth-w", payment.Withdrawal, "ETH_MAINNET", "20") // more than came in on Ethereum: fungible
	settleOn(t, db, "eth-big", payment.Withdrawal, "ETH_MAINNET", "1000")
	// A row from before networks existed counts on its asset's network.
	settleOn(t, db, "old-1", payment.Deposit, "", "0.75")
	execSQL(t, dsn, `UPDATE payment_events SET network = NULL WHERE event_id = 'old-1'`)

	report, err := invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.True(t, report.OK(), report.String())
	usdc := sheetOf(t, report, "USDC")
	require.Equal(t, "15.5", usdc.Balances.String())
	flows := map[string][2]string{}
	credits, debits := decimal.Zero, decimal.Zero
	for _, f := range usdc.Networks {
		flows[f.Network] = [2]string{f.Credits.String(), f.Debits.String()}
		credits, debits = credits.Add(f.Credits), debits.Add(f.Debits)
	}
	require.Equal(t, map[string][2]string{
		"BASE_MAINNET": {"30", "2"},
		"ETH_MAINNET":  {"6.25", "20"},
		"ARB_MAINNET":  {"1.25", "0"},
	}, flows, "the refused withdrawal moved nothing")
	require.True(t, credits.Equal(usdc.Credits) && debits.Equal(usdc.Debits), "the flows add up to the asset's sheet")

	text := report.String()
	require.Contains(t, text, "USDC on BASE_MAINNET: credits 30 - debits 2 = net 28")
	require.Contains(t, text, "USDC on ETH_MAINNET: credits 6.25 - debits 20 = net -13.75")
	var networks []map[string]any
	for _, c := range report.JSON()["conservation"].([]map[string]any) {
		if c["asset"] == "USDC" {
			networks = c["networks"].([]map[string]any)
		}
	}
	require.Len(t, networks, 3)

	// The invariant itself stays per asset: a balance changed by hand
	// breaks USDC's sheet, not a network's.
	execSQL(t, dsn, `UPDATE balances SET balance = balance + 1 WHERE user_id = 1 AND asset = 'USDC'`)
	report, err = invariant.Check(ctx, db, invariant.Quiet())
	require.NoError(t, err)
	require.Contains(t, failing(report), "conservation USDC")
}

func sheetOf(t *testing.T, r invariant.Report, asset string) postgres.Conservation {
	t.Helper()
	for _, c := range r.Conservation {
		if c.Asset == asset {
			return c
		}
	}
	t.Fatalf("no conservation sheet for %s", asset)
	return postgres.Conservation{}
}

func execSQL(t *testing.T, dsn, statement string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, statement)
	require.NoError(t, err)
}
