package postgres_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

// ruleCase is one row written straight into payment_events: the columns
// that differ from a plain pending deposit, and the constraint (as named
// before migration 0019) that refuses it, or "" for a row both accept.
type ruleCase struct {
	name   string
	set    map[string]any
	broken string
}

var paymentEventRuleCases = []ruleCase{
	{name: "plain deposit", set: nil},
	{name: "confirmed deposit", set: map[string]any{"status": "confirmed", "outcome": "success"}},
	{name: "post of a hold", set: map[string]any{"event_type": "withdrawal_post", "amount": "0", "hold_id": "h-1"}},
	{name: "held hold", set: map[string]any{"event_type": "withdrawal_hold", "status": "confirmed", "outcome": "held"}},
	{name: "void of a closed hold", set: map[string]any{"event_type": "withdrawal_void", "amount": "0", "hold_id": "h-1", "status": "failed", "outcome": "hold_closed"}},
	{name: "awaiting with its check", set: map[string]any{"status": "awaiting_finality", "next_check_at": "2026-12-01T00:00:00Z"}},
	{name: "chain columns", set: map[string]any{"network": "BASE_SEPOLIA", "to_address": "0x" + strings.Repeat("ab", 20),
		"tx_hash": "0x" + strings.Repeat("cd", 32), "transfer_index": "trace:call_0_1", "chain_state": "watching",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},

	{name: "empty id", set: map[string]any{"event_id": ""}, broken: "payment_events_event_id_check"},
	{name: "long id", set: map[string]any{"event_id": strings.Repeat("x", 257)}, broken: "payment_events_event_id_check"},
	{name: "unknown type", set: map[string]any{"event_type": "refund"}, broken: "payment_events_event_type_check"},
	{name: "unknown status", set: map[string]any{"status": "done"}, broken: "payment_events_status_check"},
	{name: "unknown outcome", set: map[string]any{"status": "confirmed", "outcome": "fine"}, broken: "payment_events_outcome_check"},
	{name: "negative retries", set: map[string]any{"retry_count": -1}, broken: "payment_events_retry_count_check"},
	{name: "negative generation", set: map[string]any{"generation": -1}, broken: "payment_events_generation_check"},
	{name: "short content hash", set: map[string]any{"content_hash": make([]byte, 31)}, broken: "payment_events_content_hash_check"},
	{name: "unknown source", set: map[string]any{"source": "etherscan"}, broken: "payment_events_source_check"},
	{name: "unknown chain state", set: map[string]any{"chain_state": "maybe"}, broken: "payment_events_chain_state_check"},
	{name: "empty hold id", set: map[string]any{"event_type": "withdrawal_post", "amount": "0", "hold_id": ""}, broken: "payment_events_hold_id_check"},
	{name: "lower-case network", set: map[string]any{"network": "base"}, broken: "payment_events_network_check"},
	{name: "upper-case address", set: map[string]any{"to_address": "0x" + strings.Repeat("AB", 20)}, broken: "payment_events_to_address_check"},
	{name: "bad traceparent", set: map[string]any{"traceparent": "00-xyz"}, broken: "payment_events_traceparent_format"},
	{name: "bad transfer index", set: map[string]any{"transfer_index": "first"}, broken: "payment_events_transfer_index_check"},
	{name: "short tx hash", set: map[string]any{"tx_hash": "0x1234"}, broken: "payment_events_tx_hash_check"},
	{name: "zero deposit", set: map[string]any{"amount": "0"}, broken: "payment_events_amount_check"},
	{name: "negative deposit", set: map[string]any{"amount": "-1"}, broken: "payment_events_amount_check"},
	{name: "awaiting without a check", set: map[string]any{"status": "awaiting_finality"}, broken: "payment_events_awaiting_has_check"},
	{name: "hold id on a deposit", set: map[string]any{"hold_id": "h-1"}, broken: "payment_events_hold_id_types"},
	{name: "post without a hold id", set: map[string]any{"event_type": "withdrawal_post", "amount": "0"}, broken: "payment_events_hold_id_types"},
	{name: "held deposit", set: map[string]any{"status": "confirmed", "outcome": "held"}, broken: "payment_events_hold_outcomes"},
	{name: "closed hold on a deposit", set: map[string]any{"status": "failed", "outcome": "hold_closed"}, broken: "payment_events_hold_outcomes"},
	{name: "terminal without an outcome", set: map[string]any{"status": "failed"}, broken: "payment_events_outcome_terminal"},
	{name: "outcome while pending", set: map[string]any{"outcome": "success"}, broken: "payment_events_outcome_terminal"},
}

// insertRuleCase writes the case's row with the guard triggers off
// (session_replication_role), so every row reaches the CHECKs.
func insertRuleCase(ctx context.Context, conn *pgx.Conn, id string, c ruleCase) error {
	cols := map[string]any{
		"event_id": id, "event_type": "deposit", "user_id": 1, "asset": "ETH", "amount": "1",
		"content_hash": make([]byte, 32), "trace_id": "", "status": "pending",
	}
	for k, v := range c.set {
		cols[k] = v
	}
	var names, params []string
	var args []any
	for k, v := range cols {
		names = append(names, k)
		args = append(args, v)
		params = append(params, "$"+strconv.Itoa(len(args)))
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // every case is undone
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO payment_events (`+strings.Join(names, ", ")+`) VALUES (`+strings.Join(params, ", ")+`)`, args...)
	return err
}

// TestPaymentEventsRulesAsBefore: migration 0019 folds payment_events'
// twenty CHECKs into one; every row each of them refused is refused
// after it, under the same constraint name, and every row they admitted
// is admitted. The same cases run against both schemas.
func TestPaymentEventsRulesAsBefore(t *testing.T) {
	ctx := context.Background()
	db, conn := migratedTo(t, 18)

	check := func(schema string) {
		for i, c := range paymentEventRuleCases {
			err := insertRuleCase(ctx, conn, schema+"-"+strconv.Itoa(i), c)
			if c.broken == "" {
				require.NoError(t, err, "%s, %s", schema, c.name)
				continue
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%s, %s: %v", schema, c.name, err)
			require.Equal(t, "23514", pgErr.Code, "%s, %s: %v", schema, c.name, err)
			require.Equal(t, c.broken, pgErr.ConstraintName, "%s, %s: %v", schema, c.name, err)
		}
	}
	check("0018")
	_, err := conn.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, trace_id)
		VALUES ('before-0019', 'deposit', 1, 'ETH', 1, sha256('x'), '')`)
	require.NoError(t, err)

	applied, err := db.MigrateTo(ctx, 19)
	require.NoError(t, err)
	require.Equal(t, []string{"0019_payment_events_rules.sql"}, applied)
	check("0019")

	// A row from before is updated under the new rules like any other.
	_, err = conn.Exec(ctx, `UPDATE payment_events SET retry_count = -1 WHERE event_id = 'before-0019'`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "payment_events_retry_count_check", pgErr.ConstraintName)
	_, err = conn.Exec(ctx, `UPDATE payment_events SET retry_count = 1 WHERE event_id = 'before-0019'`)
	require.NoError(t, err)
}

// TestPaymentEventsChecksStayCheap: PostgreSQL reads a table's CHECKs
// back from their stored node trees for every statement that writes a
// row, so payment_events, written twice per event, keeps them small
// (0019 took them from 22 kB to about 2 kB). A new rule belongs in
// payment_events_check.
func TestPaymentEventsChecksStayCheap(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var size, count int
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(length(conbin)), 0), count(*) FROM pg_constraint
		WHERE conrelid = 'payment_events'::regclass AND contype = 'c'`).Scan(&size, &count))
	require.Equal(t, 1, count, "payment_events has %d CHECKs", count)
	require.Less(t, size, 4096, "payment_events' CHECKs store %d bytes of node tree", size)
}

// TestCreditWithoutClaimRefused (0027): a deposit naming a transaction
// commits confirmed only with its transfer claim, whoever writes it, in
// whichever order; one without a transaction needs none. A round-one
// worker credited after 0007 without a claim, and the same transfer
// reported again under its chain: id was credited twice.
func TestCreditWithoutClaimRefused(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.DatabaseURL(t)
	_, err := testenv.OpenDB(t, dsn).CreateUser(ctx, 1)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx := "0x" + strings.Repeat("ab", 32)
	insert := func(id, txHash string) {
		t.Helper()
		var hash any
		if txHash != "" {
			hash = txHash
		}
		_, err := conn.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, tx_hash, trace_id, content_hash)
			VALUES ($1, 'deposit', 1, 'ETH', 1, $2, 't', sha256(convert_to($3, 'UTF8')))`, id, hash, id)
		require.NoError(t, err)
	}
	confirm := func(id string, claimFirst, claim bool, index string) error {
		t.Helper()
		txn, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = txn.Rollback(ctx) }()
		writeClaim := func() {
			_, err := txn.Exec(ctx, `INSERT INTO chain_transfers (network, tx_hash, transfer_index, event_id, asset) VALUES ('ETH_MAINNET', $1, $2, $3, 'ETH')`, tx, index, id)
			require.NoError(t, err)
		}
		if claim && claimFirst {
			writeClaim()
		}
		for _, next := range []string{"enqueued", "processing", "confirmed"} {
			if _, err := txn.Exec(ctx, `UPDATE payment_events SET status = $2, outcome = CASE WHEN $2 = 'confirmed' THEN 'success' END WHERE event_id = $1`, id, next); err != nil {
				return err
			}
		}
		if claim && !claimFirst {
			writeClaim()
		}
		return txn.Commit(ctx)
	}
	insert("no-claim", tx)
	err = confirm("no-claim", false, false, "")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "refused at commit: %v", err)
	require.Equal(t, "payment_events_credit_holds_claim", pgErr.ConstraintName)
	insert("claim-after", tx)
	require.NoError(t, confirm("claim-after", false, true, "0"))
	insert("claim-before", tx)
	require.NoError(t, confirm("claim-before", true, true, "1"))
	insert("no-transaction", "")
	require.NoError(t, confirm("no-transaction", false, false, ""))
}
