package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestRunbookSQLRunsAgainstSchema runs every SQL query a runbook gives the
// operator against a freshly migrated database: a query naming a column or
// table the schema lacks would fail at 3 a.m., in front of the operator.
func TestRunbookSQLRunsAgainstSchema(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)

	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "runbooks", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	query := regexp.MustCompile("`((?:SELECT|UPDATE|DELETE|INSERT)\\b[^`]*)`")
	var failures []string
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		text := strings.Join(strings.Fields(string(raw)), " ")
		for _, m := range query.FindAllStringSubmatch(text, -1) {
			q := m[1]
			q = strings.ReplaceAll(q, "'...'", "'x'")
			q = strings.ReplaceAll(q, "$1", "1")
			q = strings.ReplaceAll(q, "$2", "'ETH'")
			n++
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			rows, err := tx.Query(ctx, q)
			if err == nil {
				for rows.Next() {
				}
				rows.Close()
				err = rows.Err()
			}
			_ = tx.Rollback(ctx)
			if err != nil {
				failures = append(failures, filepath.Base(f)+": "+q+"\n    -> "+err.Error())
			}
		}
	}
	require.NotZero(t, n)
	require.Empty(t, failures, "runbook SQL that does not run against the schema:\n%s", strings.Join(failures, "\n"))
}

// runCtl runs one settlectl command in process against dsn.
func runCtl(t *testing.T, dsn string, args ...string) (string, error) {
	t.Helper()
	t.Setenv("DATABASE_URL", dsn)
	cmd, ok := commands[args[0]]
	require.True(t, ok, "no command %s", args[0])
	var out bytes.Buffer
	err := cmd.run(context.Background(), args[1:], &out)
	return out.String(), err
}

// TestUsersCreateBadInitialHasNoEffect: `users create ID --initial X`
// with a malformed --initial or an unknown asset is a usage error (exit 2),
// and a usage error changes nothing: the user is not created.
func TestUsersCreateBadInitialHasNoEffect(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	_, err := runCtl(t, dsn, "users", "create", "7", "--initial", "ETH")
	require.ErrorIs(t, err, config.ErrUsage, "malformed --initial")
	_, err = runCtl(t, dsn, "users", "create", "8", "--initial", "NOPE=1")
	require.ErrorIs(t, err, config.ErrUsage, "unknown asset")
	_, err = runCtl(t, dsn, "users", "create", "8", "--initial", "ETH=1", "--initial", "ETH=0.x")
	require.ErrorIs(t, err, config.ErrUsage, "malformed amount after a good one")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM users WHERE id IN (7, 8)`).Scan(&n))
	require.Zero(t, n, "a refused `users create` created the user anyway")
}

// TestBoolFlagBeforeID: `events recheck --json ID --operator bob` is the
// usage line's flags in another order: a bool flag takes no value, so the
// ID after it stays positional.
func TestBoolFlagBeforeID(t *testing.T) {
	for _, args := range [][]string{
		{"--json", "ev-1", "--operator", "bob"},
		{"--operator", "bob", "--json", "ev-1", "--operator", "bob"},
		{"ev-1", "--json=true", "--operator=bob"},
		{"--json", "--operator", "bob", "--", "ev-1"},
	} {
		fs := flag.NewFlagSet("events recheck", flag.ContinueOnError)
		fs.String("operator", "", "")
		jsonOut := fs.Bool("json", false, "")
		rest, err := parseFlags(fs, args, "ID")
		require.NoError(t, err, "args %q", args)
		require.Equal(t, []string{"ev-1"}, rest)
		require.True(t, *jsonOut)
	}
}

// TestAddressesUnknownNetwork: as POST /admin/deposit-addresses answers
// a 400 naming the network, and `assets add` exits 2 with "unknown
// network", `addresses add --network NOPE` is a usage error naming it,
// not PostgreSQL's foreign-key violation.
func TestAddressesUnknownNetwork(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	_, err := runCtl(t, dsn, "users", "create", "7")
	require.NoError(t, err)
	_, err = runCtl(t, dsn, "addresses", "add", "--network", "ETH_MAINET", "--address", "0xab12ab12ab12ab12ab12ab12ab12ab12ab12ab12", "--user", "7")
	require.Error(t, err)
	t.Logf("settlectl addresses add --network ETH_MAINET: %v", err)
	require.NotContains(t, err.Error(), "SQLSTATE", "raw database error shown to the operator")
	require.Contains(t, err.Error(), "unknown network")
	require.ErrorIs(t, err, config.ErrUsage, "bad input is exit 2, as for assets add")
}

// TestSubcommandHelp: `settlectl dlq list --help` (or -h on any
// subcommand) is how an operator finds a command's flags: they are
// printed on stdout and the command exits 0 without doing anything.
func TestSubcommandHelp(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "settlectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, args := range [][]string{{"dlq", "list", "--help"}, {"rescan", "-h"}, {"networks", "add", "-h"}, {"check", "--help"}, {"users", "create", "-h"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=") // nothing may be needed to print help
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		name := strings.Join(args, " ")
		assert.NoError(t, err, "settlectl %s: %s", name, stderr.String())
		assert.Contains(t, stdout.String(), "usage: settlectl "+args[0], "settlectl %s", name)
		assert.Contains(t, stdout.String(), "  -", "settlectl %s lists no flags", name)
	}
}

// TestListLimitsAreChecked: a --limit outside a list's page size is a
// usage error, not silently the default or the maximum.
func TestListLimitsAreChecked(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	for _, args := range [][]string{
		{"holds", "list", "--limit", "0"},
		{"holds", "list", "--limit", "100000"},
		{"dlq", "list", "--limit", "-5"},
		{"dlq", "list", "--limit", "0"},
		{"notifications", "list", "--limit", "0"},
	} {
		_, err := runCtl(t, dsn, args...)
		require.ErrorIs(t, err, config.ErrUsage, "settlectl %s", strings.Join(args, " "))
	}
	for _, args := range [][]string{{"holds", "list", "--limit", "1"}, {"dlq", "list", "--limit", "1"}} {
		_, err := runCtl(t, dsn, args...)
		require.NoError(t, err, "settlectl %s", strings.Join(args, " "))
	}
}

// TestRescanCancel: `rescan cancel ID --reason WHY` ends a running job
// (one typed far above the head waits forever otherwise), its error
// naming who and why; it needs a reason, a job that ended is a conflict
// and an unknown one is not found.
func TestRescanCancel(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO rescan_jobs (id, network, from_block, to_block, next_block, operator)
		VALUES ('rescan-typo', 'ETH_MAINNET', 30000000, 30000100, 30000000, 'alice')`)
	require.NoError(t, err)

	// status shows a restart: how often, when and why.
	_, err = conn.Exec(ctx, `UPDATE rescan_jobs SET restarts = 1, last_restart_at = '2026-01-02T03:04:05Z',
		last_restart_reason = 'the branch changed under the job; reading again from block 30000000' WHERE id = 'rescan-typo'`)
	require.NoError(t, err)
	out, err := runCtl(t, dsn, "rescan", "status", "rescan-typo")
	require.NoError(t, err)
	var status map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &status), out)
	require.EqualValues(t, 1, status["restarts"])
	require.Equal(t, "2026-01-02T03:04:05Z", status["last_restart_at"])
	require.Equal(t, "the branch changed under the job; reading again from block 30000000", status["last_restart_reason"])

	_, err = runCtl(t, dsn, "rescan", "cancel", "rescan-typo")
	require.ErrorIs(t, err, config.ErrUsage, "a cancel says why")
	out, err = runCtl(t, dsn, "rescan", "cancel", "rescan-typo", "--operator", "bob", "--reason", "typo: block 3,000,000 meant")
	require.NoError(t, err)
	var job map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &job), out)
	require.Equal(t, "failed", job["status"])
	require.Equal(t, "cancelled by bob: typo: block 3,000,000 meant", job["error"])
	_, err = runCtl(t, dsn, "rescan", "cancel", "rescan-typo", "--reason", "again")
	require.ErrorIs(t, err, postgres.ErrRescanEnded)
	_, err = runCtl(t, dsn, "rescan", "cancel", "rescan-nope", "--reason", "typo")
	require.ErrorIs(t, err, payment.ErrNotFound)
}

// TestRedeliverFailed: `notifications redeliver-failed` sends every failed
// notification again, page after page, and nothing else.
func TestRedeliverFailed(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, status, attempts)
		SELECT 'd-' || i, 'e-' || i, 1, 'deposit_credited', '{}', CASE WHEN i <= 5 THEN 'failed' ELSE 'delivered' END, 20
		FROM generate_series(1, 6) AS i`)
	require.NoError(t, err)

	_, err = runCtl(t, dsn, "notifications", "redeliver-failed", "--limit", "0")
	require.ErrorIs(t, err, config.ErrUsage)
	out, err := runCtl(t, dsn, "notifications", "redeliver-failed", "--limit", "2", "--operator", "carol")
	require.NoError(t, err)
	require.Contains(t, out, "scheduled again: 5")
	var pending, failed, asked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending' AND attempts = 0),
		count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE redelivery_requested_by = 'carol')
		FROM notification_outbox`).Scan(&pending, &failed, &asked))
	require.Equal(t, []int{5, 0, 5}, []int{pending, failed, asked})
	out, err = runCtl(t, dsn, "notifications", "redeliver-failed")
	require.NoError(t, err)
	require.Contains(t, out, "scheduled again: 0")
}

// TestDLQListShowsRedisFallback: dead letters parked in the Redis
// fallback (PostgreSQL refused them) are not in the list until the
// scheduler drains them; `dlq list` says how many wait there, says so
// when Redis cannot be read, and refuses a malformed REDIS_URL.
func TestDLQListShowsRedisFallback(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	url := testenv.RedisURL(t)
	t.Setenv("REDIS_URL", url)
	out, err := runCtl(t, dsn, "dlq", "list")
	require.NoError(t, err)
	require.Contains(t, out, "(none waiting in the Redis fallback)")

	rdb, err := redisconn.Open(url)
	require.NoError(t, err)
	defer rdb.Close()
	require.NoError(t, rdb.RPush(context.Background(), dlq.FallbackKey, `{"event_id":"a"}`, `{"event_id":"b"}`).Err())
	out, err = runCtl(t, dsn, "dlq", "list")
	require.NoError(t, err)
	require.Contains(t, out, "(2 more waiting in the Redis fallback;")
	out, err = runCtl(t, dsn, "dlq", "list", "--json")
	require.NoError(t, err)
	var entries []any
	require.NoError(t, json.Unmarshal([]byte(out), &entries), "JSON stays only JSON: %s", out)
	out, err = runCtl(t, dsn, "dlq", "list", "--state", "resolved")
	require.NoError(t, err)
	require.NotContains(t, out, "Redis fallback", "resolved entries are never in the fallback")

	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")
	out, err = runCtl(t, dsn, "dlq", "list")
	require.NoError(t, err, "the list itself is PostgreSQL's")
	require.Contains(t, out, "(the Redis fallback could not be read (REDIS_URL):")

	t.Setenv("REDIS_URL", "localhost:6379")
	_, err = runCtl(t, dsn, "dlq", "list")
	require.ErrorIs(t, err, config.ErrUsage)
	require.ErrorContains(t, err, "REDIS_URL")
}

// TestRecheckReadsLogLevel: a recheck logs what its chain client says to
// stderr at LOG_LEVEL (warnings by default); a LOG_LEVEL the services
// would refuse is a usage error naming it.
func TestRecheckReadsLogLevel(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	t.Setenv("LOG_LEVEL", "loud")
	_, err := runCtl(t, dsn, "events", "recheck", "e-1")
	require.ErrorIs(t, err, config.ErrUsage)
	require.ErrorContains(t, err, "LOG_LEVEL")
	t.Setenv("LOG_LEVEL", "debug")
	t.Setenv("ETH_RPC_URL", "")
	_, err = runCtl(t, dsn, "events", "recheck", "e-1")
	require.ErrorIs(t, err, errNoRPC, "a valid LOG_LEVEL passes on to the next check")
}
