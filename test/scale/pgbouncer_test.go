package scale

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

const (
	// pgBouncerPoolSize is the server connections PgBouncer may open per
	// database: far fewer than the processes' pools hold between them, so
	// their transactions really share server connections.
	pgBouncerPoolSize = 8
	// execModeSetting is what settle's DATABASE_URL needs behind PgBouncer
	// in transaction pooling (TestPgBouncerExecModes shows why).
	execModeSetting = "default_query_exec_mode=cache_describe"
	// notificationDropped is what PgBouncer logs when a NOTIFY reaches a
	// server connection that no client holds.
	notificationDropped = "got packet 'A' from server when not linked"
)

// startPgBouncer runs a real pgbouncer, transaction pooling, in front of
// the PostgreSQL server that s's database lives on.
func startPgBouncer(t *testing.T, s *harness.Stack, poolSize int, settings map[string]string) *devenv.PgBouncer {
	t.Helper()
	if _, err := devenv.PgBouncerPath(); err != nil {
		t.Fatalf("%v: the scale tests run settle behind a real PgBouncer", err)
	}
	u, err := url.Parse(s.DatabaseURL)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bouncer, err := devenv.StartPgBouncer(ctx, devenv.PgBouncerOptions{
		PostgresHost: u.Hostname(), PostgresPort: port, PoolMode: "transaction",
		DefaultPoolSize: poolSize, Users: []string{u.User.Username()}, Settings: settings,
	})
	require.NoError(t, err)
	// Registered after the stack's cleanup, this runs first: the
	// processes stop before their pooler goes away.
	t.Cleanup(func() {
		stopAll(s)
		if t.Failed() {
			t.Logf("---- pgbouncer log (tail) ----\n%s", tailText(bouncer.Log(), 30))
		}
		bouncer.Close()
	})
	return bouncer
}

// TestPgBouncerExecModes is the evidence for the DATABASE_URL setting.
// Two clients share PgBouncer's server connections in transaction
// pooling. pgx's default mode, cache_statement, prepares named statements
// on whichever server connection it was handed; the next client handed
// that connection collides with the name (42P05), and the first client,
// handed another connection, finds its statement gone (26000). The modes
// that use only the unnamed statement, re-parsed in the same message
// sequence as it is executed, work.
func TestPgBouncerExecModes(t *testing.T) {
	s := harness.NewStack(t)
	settings := map[string]string{}
	if major, minor, err := devenv.PgBouncerVersion(); err == nil && (major > 1 || minor >= 21) {
		// 1.21+ can track protocol-level prepared statements; keep it
		// off so the test shows what the pooler alone does.
		settings["max_prepared_statements"] = "0"
	}
	bouncer := startPgBouncer(t, s, 2, settings)
	database := databaseName(t, s.DatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const query = `SELECT decimals FROM assets WHERE code = $1`

	for _, mode := range []string{"cache_statement", "cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			connect := func() *pgx.Conn {
				conn, err := pgx.Connect(ctx, bouncer.URL("postgres", database, "default_query_exec_mode="+mode))
				require.NoError(t, err)
				t.Cleanup(func() { conn.Close(context.WithoutCancel(ctx)) })
				return conn
			}
			holder, a, b := connect(), connect(), connect()
			run := func(c *pgx.Conn) string {
				var decimals int
				err := c.QueryRow(ctx, query, "USDC").Scan(&decimals)
				var pgErr *pgconn.PgError
				switch {
				case err == nil:
					require.Equal(t, 6, decimals)
					return "ok"
				case errors.As(err, &pgErr):
					return pgErr.Code
				default:
					require.NoError(t, err)
					return ""
				}
			}
			// The holder pins one of the two server connections, so a and b
			// are both handed the other one.
			tx, err := holder.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SELECT 1`)
			require.NoError(t, err)
			first := run(a)
			second := run(b)
			// Released last, the holder's connection is the next one handed
			// out (PgBouncer reuses the most recent): a gets a connection
			// it never prepared on.
			require.NoError(t, tx.Commit(ctx))
			third := run(a)
			t.Logf("%s: a %s, b on the same server connection %s, a on the other connection %s", mode, first, second, third)
			require.Equal(t, "ok", first)
			if mode == "cache_statement" {
				require.Equal(t, "42P05", second, "duplicate_prepared_statement: b prepares the name a left on the shared connection")
				require.Contains(t, []string{"26000", "ok"}, third, "invalid_sql_statement_name when a lands on the other connection")
				return
			}
			require.Equal(t, "ok", second)
			require.Equal(t, "ok", third)
		})
	}
}

// TestPgBouncerEndToEnd runs the whole system through PgBouncer in
// transaction pooling: migrations on an empty schema, api, two workers and
// the scheduler with DATABASE_URL through the pooler (cache_describe) and
// the scheduler's LISTEN on a direct connection; a few thousand signed
// deposits and withdrawals with duplicate, concurrent and conflicting
// redeliveries; then reconcile and check through the pooler, and finally
// every pooled server connection inspected for session state left behind.
func TestPgBouncerEndToEnd(t *testing.T) {
	s := harness.NewStack(t)
	bouncer := startPgBouncer(t, s, pgBouncerPoolSize, nil)
	database := databaseName(t, s.DatabaseURL)
	s.Env["DATABASE_URL"] = bouncer.URL("postgres", database, execModeSetting)
	s.Env["DATABASE_LISTEN_URL"] = s.DatabaseURL
	ctx := context.Background()

	// Migrate from nothing, through the pooler, twice.
	_, err := s.DB.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)
	out, code := apiMigrate(t, s)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "0001_init.sql", "the migrations were applied")
	require.Equal(t, 7, s.Count(`SELECT count(*) FROM assets`), "the seeded assets (POL since 0012)")
	out, code = apiMigrate(t, s)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"applied":[]`, "a second run is a no-op")

	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartWorker(nil)
	s.StartScheduler(nil)
	db := testenv.OpenDB(t, s.DatabaseURL)

	const events = 3000
	runLoad(t, s, db, newFront(t, api.URL()), load{events: events, users: 100, withdrawals: 30, runID: "pgbouncer"})
	requireBooks(t, db, s)

	out, code = s.Settlectl("reconcile")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, " 0 mismatches", out)
	out, code = s.Settlectl("check", "--require-terminal")
	require.Equal(t, 0, code, out)

	// The traffic really went through the pooler, and more clients than
	// server connections shared it.
	stats := pgBouncerShow(t, bouncer, "STATS", database)
	transactions, _ := strconv.Atoi(stats["total_xact_count"])
	// Ingest and ledger batch many events per transaction, so fewer
	// transactions than events is expected.
	require.Positive(t, transactions, "transactions through PgBouncer: %v", stats)
	clients, servers := len(pgBouncerShowAll(t, bouncer, "CLIENTS", database)), len(pgBouncerShowAll(t, bouncer, "SERVERS", database))
	t.Logf("PgBouncer: %d transactions, %d client connections on %d server connections (pool size %d)", transactions, clients, servers, pgBouncerPoolSize)
	require.LessOrEqual(t, servers, pgBouncerPoolSize)
	require.Greater(t, clients, pgBouncerPoolSize, "the processes' connections outnumber the server connections")
	for _, p := range s.Procs {
		require.NotContains(t, p.Logs(), "prepared statement", "%s met a prepared statement error", p.Name)
	}

	// Every server connection the processes shared is as clean as a new
	// session: no setting, prepared statement, LISTEN, advisory lock,
	// cursor or temporary table outlived the transaction that made it.
	stopAll(s)
	fresh := freshSession(t, s)
	for _, got := range serverSessions(t, bouncer, database) {
		require.Equal(t, fresh.settings, got.settings, "settings left on server connection %d", got.pid)
		require.Empty(t, got.listening, "LISTEN left on server connection %d", got.pid)
		require.Zero(t, got.prepared+got.advisoryLocks+got.cursors+got.tempSchemas,
			"session state left on server connection %d: %+v", got.pid, got)
	}
}

// TestPgBouncerListenThroughPooler leaves DATABASE_LISTEN_URL unset, so the
// scheduler's LISTEN goes through PgBouncer too. LISTEN is session state:
// it runs on whichever server connection PgBouncer hands out, which goes
// back to the pool right after, and a NOTIFY that reaches it while no
// client holds it is dropped (PgBouncer logs notificationDropped). The
// scheduler is never woken and logs nothing: the outbox poll alone must
// deliver every event, only later. This run also uses the other safe exec
// mode, exec, end to end.
func TestPgBouncerListenThroughPooler(t *testing.T) {
	s := harness.NewStack(t)
	bouncer := startPgBouncer(t, s, pgBouncerPoolSize, nil)
	database := databaseName(t, s.DatabaseURL)
	s.Env["DATABASE_URL"] = bouncer.URL("postgres", database, "default_query_exec_mode=exec")
	s.Env["POLL_INTERVAL"] = "1s"
	api := s.StartAPI(nil)
	s.StartWorker(nil)
	s.StartWorker(nil)
	scheduler := s.StartScheduler(nil)
	db := testenv.OpenDB(t, s.DatabaseURL)

	runLoad(t, s, db, newFront(t, api.URL()), load{events: 1000, users: 50, withdrawals: 30, runID: "listen-pooled"})
	requireBooks(t, db, s)
	t.Logf("notifications PgBouncer dropped: %d", strings.Count(bouncer.Log(), notificationDropped))
	require.Contains(t, scheduler.Logs(), "LISTEN receives no notifications", "the scheduler says it is polling only")

	// The LISTEN is still there, on one pooled server connection that any
	// client may be handed, and outlives the scheduler that issued it.
	stopAll(s)
	var listening []string
	for _, got := range serverSessions(t, bouncer, database) {
		listening = append(listening, got.listening...)
	}
	require.Equal(t, []string{"settle_outbox"}, listening, "the scheduler's LISTEN sits on a pooled server connection")
}

// session is what a server connection carries beyond its transaction.
type session struct {
	pid                                           int
	settings                                      string
	listening                                     []string
	prepared, advisoryLocks, cursors, tempSchemas int
}

const sessionQuery = `SELECT pg_backend_pid(),
	current_setting('statement_timeout') || ' ' || current_setting('lock_timeout') || ' ' ||
		current_setting('idle_in_transaction_session_timeout') || ' ' || current_setting('search_path') || ' ' ||
		current_setting('default_transaction_isolation') || ' ' || current_setting('timezone'),
	ARRAY(SELECT pg_listening_channels()),
	(SELECT count(*) FROM pg_prepared_statements),
	(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
	(SELECT count(*) FROM pg_cursors WHERE name <> ''), -- '' is this query's own portal
	(SELECT count(*) FROM pg_namespace WHERE oid = pg_my_temp_schema())`

func scanSession(row pgx.Row) (session, error) {
	var got session
	err := row.Scan(&got.pid, &got.settings, &got.listening, &got.prepared, &got.advisoryLocks, &got.cursors, &got.tempSchemas)
	return got, err
}

// freshSession is a new direct session's state, the baseline.
func freshSession(t *testing.T, s *harness.Stack) session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DatabaseURL+"&default_query_exec_mode=exec")
	require.NoError(t, err)
	defer conn.Close(ctx)
	got, err := scanSession(conn.QueryRow(ctx, sessionQuery))
	require.NoError(t, err)
	return got
}

// serverSessions reads the state of every server connection in
// PgBouncer's pool for database: it holds one transaction per pool slot
// at once, so each lands on a different server connection. Nothing else
// may be using the pool.
func serverSessions(t *testing.T, bouncer *devenv.PgBouncer, database string) []session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []session
	pids := map[int]bool{}
	for range pgBouncerPoolSize {
		conn, err := pgx.Connect(ctx, bouncer.URL("postgres", database, "default_query_exec_mode=exec"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		got, err := scanSession(tx.QueryRow(ctx, sessionQuery))
		require.NoError(t, err)
		require.False(t, pids[got.pid], "server connection %d handed out twice while held", got.pid)
		pids[got.pid] = true
		out = append(out, got)
	}
	return out
}

// apiMigrate runs `api migrate` with the stack's settings.
func apiMigrate(t *testing.T, s *harness.Stack) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(harness.Binaries(t), "api"), "migrate")
	cmd.Env = testenv.Env(s.Env)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("api migrate: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// pgBouncerShowAll runs SHOW <what> on PgBouncer's admin console and
// returns the rows for database.
func pgBouncerShowAll(t *testing.T, bouncer *devenv.PgBouncer, what, database string) []map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The admin console speaks only the simple protocol.
	conn, err := pgx.Connect(ctx, bouncer.URL("postgres", "pgbouncer", "default_query_exec_mode=simple_protocol"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW "+what)
	require.NoError(t, err)
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		// The simple protocol answers in text: take it as it is.
		values := rows.RawValues()
		row := map[string]string{}
		for i, field := range rows.FieldDescriptions() {
			row[field.Name] = string(values[i])
		}
		if row["database"] == database {
			out = append(out, row)
		}
	}
	require.NoError(t, rows.Err())
	return out
}

func pgBouncerShow(t *testing.T, bouncer *devenv.PgBouncer, what, database string) map[string]string {
	t.Helper()
	rows := pgBouncerShowAll(t, bouncer, what, database)
	require.Len(t, rows, 1, "SHOW %s for %s", what, database)
	return rows[0]
}
