package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// TestDanglingFlagIsNotAValue: `dlq discard 7 --reason` (the value
// forgotten) must not discard with the reason "--", the separator the
// reordering puts before the id; a blank reason is no reason either.
func TestDanglingFlagIsNotAValue(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	for _, args := range [][]string{
		{"dlq", "discard", "7", "--reason"},
		{"dlq", "discard", "7", "--reason", "  "},
		{"rescan", "cancel", "rescan-x", "--reason"},
		{"users", "create", "7", "--initial"},
	} {
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", strings.Join(args, " "))
	}
	fs := flag.NewFlagSet("dlq discard", flag.ContinueOnError)
	reason := fs.String("reason", "", "")
	_, err := parseFlags(fs, []string{"7", "--reason"}, "ID")
	require.ErrorContains(t, err, "flag needs an argument: --reason")
	require.Empty(t, *reason)
}

// TestBadFlagValuesAreUsageErrors: a value outside what a flag takes is
// exit 2 naming the flag, never a database error, a silent default or an
// empty list that reads as "nothing there".
func TestBadFlagValuesAreUsageErrors(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	_, err := runCtl(t, dsn, "users", "create", "7")
	require.NoError(t, err)
	for _, args := range [][]string{
		{"addresses", "add", "--network", "eth'mainnet", "--address", "0xab12ab12ab12ab12ab12ab12ab12ab12ab12ab12", "--user", "7"},
		{"reconcile", "--chunk", "0"},
		{"reconcile", "--chunk", "-1"},
		{"dlq", "list", "--state", "opne"},
		{"notifications", "list", "--state", "faild"},
		{"assets", "list", "--network", "BASE_MAINET"},
	} {
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", strings.Join(args, " "))
		require.NotContains(t, err.Error(), "SQLSTATE", "settlectl %s", strings.Join(args, " "))
	}
	out, err := runCtl(t, dsn, "assets", "list", "--network", "BASE_MAINNET", "--json")
	require.NoError(t, err)
	require.Contains(t, out, `"network": "BASE_MAINNET"`)
}

// TestHoldsListJSONEmpty: no holds is [] as for the other lists (a
// script iterating null fails).
func TestHoldsListJSONEmpty(t *testing.T) {
	out, err := runCtl(t, testenv.DatabaseURL(t), "holds", "list", "--json")
	require.NoError(t, err)
	require.JSONEq(t, `[]`, out)
}

// TestDLQRepeats: the happy path of list, show, replay and discard, and
// each asked again: a second replay or discard changes nothing and says so.
func TestDLQRepeats(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	ctx := context.Background()
	_, err := db.CreateUser(ctx, 1)
	require.NoError(t, err)
	for _, id := range []string{"e-1", "e-2"} {
		e := payment.Event{ID: id, Type: payment.Withdrawal, UserID: 1, Asset: "ETH", Amount: decimal.RequireFromString("2"), TraceID: "t"}
		_, err = db.InsertEvent(ctx, postgres.NewEvent{Event: e})
		require.NoError(t, err)
	}
	claimed, err := db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	for _, c := range claimed {
		e := c.Event
		moved, _, err := db.FailToDLQ(ctx, payment.DeadLetter{EventID: e.ID, EventType: string(e.Type), UserID: e.UserID, Asset: e.Asset,
			Amount: e.Amount.String(), Error: "retries exhausted", Attempt: 6, Generation: e.Generation, Source: payment.SourceWorker, TraceID: e.TraceID})
		require.NoError(t, err)
		require.True(t, moved)
	}
	out, err := runCtl(t, dsn, "dlq", "list", "--json")
	require.NoError(t, err)
	var entries []struct {
		ID     int64 `json:"id"`
		Letter struct {
			EventID string `json:"event_id"`
		} `json:"letter"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &entries), out)
	require.Len(t, entries, 2, out)
	ids := map[string]string{}
	for _, e := range entries {
		ids[e.Letter.EventID] = fmt.Sprint(e.ID)
	}
	_, err = runCtl(t, dsn, "dlq", "show", ids["e-1"])
	require.NoError(t, err)

	out, err = runCtl(t, dsn, "dlq", "replay", ids["e-1"], "--reason", "node was down", "--operator", "ops")
	require.NoError(t, err)
	require.Contains(t, out, "reopened")
	out, err = runCtl(t, dsn, "dlq", "replay", ids["e-1"], "--reason", "node was down", "--operator", "ops")
	require.NoError(t, err)
	require.Contains(t, out, "already_replayed")

	out, err = runCtl(t, dsn, "dlq", "discard", ids["e-2"], "--reason", "refunded by hand", "--operator", "ops")
	require.NoError(t, err)
	require.Contains(t, out, "discarded")
	out, err = runCtl(t, dsn, "dlq", "discard", ids["e-2"], "--reason", "refunded by hand", "--operator", "ops")
	require.NoError(t, err)
	require.Contains(t, out, "already discarded")
	_, err = runCtl(t, dsn, "dlq", "replay", ids["e-2"], "--operator", "ops")
	require.Error(t, err, "a discarded failure cannot be replayed")
	t.Logf("replay after discard: %v", err)
}
