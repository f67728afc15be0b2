package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestJSONIsTheAPIShape: `holds list|show --json` and `events recheck|
// rechecks --json` print the fields GET /v1/holds/{id} and POST
// /admin/events/{id}/recheck answer (snake_case, as every other settlectl
// --json), not Go's field names; a script reads either the same way.
func TestJSONIsTheAPIShape(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := runCtl(t, dsn, "users", "create", "1", "--initial", "ETH=5")
	require.NoError(t, err)
	for _, e := range []payment.Event{
		{ID: "h1", Type: payment.WithdrawalHold, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("2"),
			Network: "ETH_MAINNET", ToAddress: "0x00000000000000000000000000000000000000aa", TraceID: "t"},
		{ID: "dep-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("1"),
			TxHash: fmt.Sprintf("0x%064x", 1), TraceID: "t"},
	} {
		_, err := db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(t, err)
	}
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	for _, c := range claimed {
		if c.Event.Type == payment.Deposit {
			moved, err := db.DecideChainOutcome(ctx, c.Event, payment.Outcome("not_found"), "decided")
			require.NoError(t, err)
			require.True(t, moved)
			continue
		}
		_, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: c.Event}}, postgres.LedgerOptions{})
		require.NoError(t, err)
	}

	out, err := runCtl(t, dsn, "holds", "list", "--json")
	require.NoError(t, err)
	var holds []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &holds), out)
	require.Len(t, holds, 1, out)
	require.Equal(t, "h1", holds[0]["hold_id"], out)
	require.Equal(t, "2", holds[0]["amount"], out)
	require.Equal(t, "0x00000000000000000000000000000000000000aa", holds[0]["to_address"], out)
	require.Equal(t, "open", holds[0]["status"], out)
	out, err = runCtl(t, dsn, "holds", "show", "h1", "--json")
	require.NoError(t, err)
	var hold map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &hold), out)
	require.Equal(t, holds[0], hold, "show prints the hold, not a list of one")

	// No node answers: the recheck is recorded as unavailable.
	t.Setenv("ETH_RPC_URL", "http://127.0.0.1:1")
	out, err = runCtl(t, dsn, "events", "recheck", "dep-1", "--operator", "alice", "--json")
	require.Error(t, err)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Equal(t, "dep-1", r["event_id"], out)
	require.Equal(t, "unchanged", r["result"], out)
	require.Equal(t, "failed", r["status"], out)
	require.Equal(t, "alice", r["requested_by"], out)
	out, err = runCtl(t, dsn, "events", "rechecks", "dep-1", "--json")
	require.NoError(t, err)
	var history []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &history), out)
	require.Len(t, history, 1, out)
	require.Equal(t, r["recheck_id"], history[0]["recheck_id"], out)
	require.Equal(t, "unavailable", history[0]["chain_state"], out)
	require.NotContains(t, history[0], "status", "a recorded recheck keeps no event status: none rather than \"\"")
}
