package postgres_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// formatRule is one format rule migration 0020 rewrote without counted
// repetition: where it lives, and the pattern it had before.
type formatRule struct {
	table, constraint, column string
	before                    string   // the old CHECK: column ~ before
	valid                     []string // values it accepts, to mutate
}

var formatRules = func() []formatRule {
	hash := "0x" + strings.Repeat("0123456789abcdef", 4)
	addr := "0x" + strings.Repeat("0123456789", 4)
	key := strings.Repeat("a1b2c3d4", 8)
	network := formatRule{column: "network", before: `^[A-Z][A-Z0-9_]{0,63}$`,
		valid: []string{"E", "ETH_MAINNET", "BASE_SEPOLIA_2", "A" + strings.Repeat("Z9_", 21)}}
	index := formatRule{column: "transfer_index", before: `^([0-9]{1,20}|native|trace:[A-Za-z0-9_]{1,96})$`,
		valid: []string{"0", "7", "12345678901234567890", "native", "trace:call_0_1", "trace:" + strings.Repeat("aZ_9", 24)}}
	at := func(r formatRule, table, constraint string) formatRule {
		r.table, r.constraint = table, constraint
		return r
	}
	chainIndex := at(index, "chain_transfers", "chain_transfers_transfer_index_check")
	chainIndex.before = `^([0-9]{1,20}|native|trace:[A-Za-z0-9_]{1,96}|unresolved:.+)$`
	chainIndex.valid = append(chainIndex.valid, "unresolved:evt-1", "unresolved:x", "unresolved:\n")
	return []formatRule{
		at(network, "payment_events", "payment_events_network_check"),
		{table: "payment_events", constraint: "payment_events_to_address_check", column: "to_address", before: `^0x[0-9a-f]{40}$`, valid: []string{addr}},
		{table: "payment_events", constraint: "payment_events_tx_hash_check", column: "tx_hash", before: `^0x[0-9a-f]{64}$`, valid: []string{hash}},
		{table: "payment_events", constraint: "payment_events_traceparent_format", column: "traceparent",
			before: `^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`, valid: []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		at(index, "payment_events", "payment_events_transfer_index_check"),
		{table: "processed_events", constraint: "processed_events_idempotency_key_check", column: "idempotency_key", before: `^[0-9a-f]{64}$`, valid: []string{key}},
		at(network, "chain_transfers", "chain_transfers_network_check"),
		{table: "chain_transfers", constraint: "chain_transfers_tx_hash_check", column: "tx_hash", before: `^0x[0-9a-f]{64}$`, valid: []string{hash}},
		{table: "chain_transfers", constraint: "chain_transfers_block_hash_check", column: "block_hash", before: `^0x[0-9a-f]{64}$`, valid: []string{hash}},
		chainIndex,
		at(network, "balance_events", "balance_events_network_check"),
		at(network, "holds", "holds_network_check"),
		{table: "holds", constraint: "holds_to_address_check", column: "to_address", before: `^0x[0-9a-f]{40}$`, valid: []string{addr}},
		{table: "transfer_reports", constraint: "transfer_reports_reporter_check", column: "reporter",
			before: `^[a-z][a-z0-9_]{0,31}$`, valid: []string{"a", "alchemy", "quicknode_2", "z" + strings.Repeat("a_9", 10) + "b"}},
	}
}()

// formatCandidates: the valid values, each cut, grown, re-cased and
// edited at its edges, and random edits of them over an alphabet of the
// characters the rules name and some they refuse (upper case hex, a
// newline the old $ did not let through, a two-byte letter).
func formatCandidates(valid []string, rng *rand.Rand) []string {
	const alphabet = "0123456789abcdefgxzABCDEFXZ_-:.\n é"
	chars := []rune(alphabet)
	set := map[string]bool{"": true}
	for _, v := range valid {
		r := []rune(v)
		set[v], set[strings.ToUpper(v)], set[strings.ToLower(v)] = true, true, true
		set[v+"\n"], set[" "+v], set["\n"+v] = true, true, true
		for _, c := range chars {
			set[v+string(c)], set[string(c)+v] = true, true
			set[string(r[:len(r)-1])+string(c)] = true
			set[string(c)+string(r[1:])] = true
		}
		if len(r) > 1 {
			set[string(r[:len(r)-1])], set[string(r[1:])] = true, true
		}
		for range 60 {
			e := append([]rune(nil), r...)
			for range 1 + rng.IntN(3) {
				c := chars[rng.IntN(len(chars))]
				switch i := rng.IntN(len(e) + 1); rng.IntN(3) {
				case 0:
					e = append(e[:i], append([]rune{c}, e[i:]...)...)
				case 1:
					if i < len(e) {
						e = append(e[:i], e[i+1:]...)
					}
				default:
					if i < len(e) {
						e[i] = c
					}
				}
			}
			set[string(e)] = true
		}
	}
	out := make([]string, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	return out
}

// TestFormatChecksAsBefore: after migration 0020, every format rule it
// rewrote accepts exactly the strings its old pattern accepted, in
// PostgreSQL's own regex semantics, over thousands of generated strings
// near each rule's edges; none of them counts repetitions any more.
func TestFormatChecksAsBefore(t *testing.T) {
	ctx := context.Background()
	_, conn := migratedTo(t, 20)
	// Calls payment_events' rule function with one column set; the other
	// columns are a plain pending deposit's.
	_, err := conn.Exec(ctx, `CREATE FUNCTION pg_temp.event_accepts(col text, v text) RETURNS boolean LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM payment_events_check('e', 'deposit', 'pending', NULL, 1, 0, 0, sha256(''), 'payments', NULL, NULL, NULL,
				CASE col WHEN 'network' THEN v END, CASE col WHEN 'to_address' THEN v END, CASE col WHEN 'traceparent' THEN v END,
				CASE col WHEN 'transfer_index' THEN v END, CASE col WHEN 'tx_hash' THEN v END);
			RETURN true;
		EXCEPTION WHEN check_violation THEN
			RETURN false;
		END $$`)
	require.NoError(t, err)
	var source string
	require.NoError(t, conn.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = 'payment_events_check'`).Scan(&source))

	rng := rand.New(rand.NewPCG(20, 2026))
	for _, r := range formatRules {
		values := formatCandidates(r.valid, rng)
		var query string
		args := []any{values, r.before}
		if r.table == "payment_events" {
			require.NotContains(t, source, r.before, "payment_events_check still has %s", r.before)
			query = `SELECT v, pg_temp.event_accepts($3, v), (v ~ $2) IS NOT FALSE FROM unnest($1::text[]) AS v`
			args = append(args, r.column)
		} else {
			var def string
			require.NoError(t, conn.QueryRow(ctx, `SELECT pg_get_expr(conbin, conrelid) FROM pg_constraint
				WHERE conrelid = $1::regclass AND conname = $2`, r.table, r.constraint).Scan(&def), r.constraint)
			require.NotRegexp(t, `\{[0-9]`, def, "%s counts repetitions", r.constraint)
			// The constraint's own expression, over a row of one column.
			query = `SELECT v, (SELECT (` + def + `) IS NOT FALSE FROM (SELECT v AS ` + r.column + `) AS row),
				(v ~ $2) IS NOT FALSE FROM unnest($1::text[]) AS v`
		}
		rows, err := conn.Query(ctx, query, args...)
		require.NoError(t, err, r.constraint)
		seen, accepted := 0, 0
		for rows.Next() {
			var v string
			var now, before bool
			require.NoError(t, rows.Scan(&v, &now, &before))
			require.Equal(t, before, now, "%s on %q: the old rule says %v", r.constraint, v, before)
			seen++
			if now {
				accepted++
			}
		}
		require.NoError(t, rows.Err())
		require.Equal(t, len(values), seen, r.constraint)
		// Both sides of each rule were tried.
		require.Greater(t, accepted, len(r.valid)-1, r.constraint)
		require.Less(t, accepted, seen/2, r.constraint)
	}
}
