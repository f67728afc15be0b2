package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/testenv"
)

var (
	flagSeedDir  = flag.String("pgbench.seed-dir", "../../../shared/peers/seed-celery", "directory holding the seed design's schema.sql")
	flagPgEvents = flag.Int("pgbench.events", 20_000, "events per pgbench run")
	flagPgConns  = flag.Int("pgbench.clients", 2, "pgbench clients")
)

// seedEventSQL is the seed design's per-event worker path for a deposit,
// statement by statement (seedpay.py process_deposit_sync and its
// transition_event_status): one transaction and eleven statements per
// event, on the seed's own schema.
const seedEventSQL = `SELECT nextval('bench_ids') AS n \gset
BEGIN;
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '5s';
INSERT INTO processed_events (idempotency_key, outcome) VALUES (md5(:n::text), 'pending');
UPDATE payment_events SET status = 'processing', updated_at = NOW() WHERE event_id = 'e' || :n AND status = 'enqueued';
SELECT id FROM users WHERE id = :n % 100;
UPDATE users SET balance = balance + 1.5 WHERE id = :n % 100;
INSERT INTO balance_events (user_id, amount, event_type, source_event_id, created_at) VALUES (:n % 100, 1.5, 'deposit', 'e' || :n, NOW());
UPDATE processed_events SET outcome = 'success' WHERE idempotency_key = md5(:n::text);
UPDATE payment_events SET retry_count = 0 WHERE event_id = 'e' || :n;
UPDATE payment_events SET status = 'confirmed', updated_at = NOW() WHERE event_id = 'e' || :n AND status = 'processing';
COMMIT;
`

// BenchmarkPgbenchSeedSQL runs the seed design's per-event SQL under
// pgbench against the same kind of PostgreSQL (fsync and synchronous_commit
// on) that the end-to-end benchmark uses: the ceiling of the seed's worker
// path on this machine, whatever language drives it.
func BenchmarkPgbenchSeedSQL(b *testing.B) {
	schema, err := os.ReadFile(filepath.Join(*flagSeedDir, "schema.sql"))
	if err != nil {
		b.Skipf("the seed design's schema is not here (%v); pass -pgbench.seed-dir", err)
	}
	pg := testenv.Postgres(b)
	if pg == nil {
		b.Fatal("needs the harness's own PostgreSQL")
	}
	for range b.N {
		dsn := testenv.EmptyDatabaseURL(b)
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.PgConn().Exec(ctx, string(schema)).ReadAll(); err != nil {
			b.Fatal(err)
		}
		n := *flagPgEvents
		setup := fmt.Sprintf(`
			INSERT INTO users (id, balance) SELECT i, 0 FROM generate_series(0, 99) i;
			INSERT INTO payment_events (event_id, user_id, amount, event_type, status)
				SELECT 'e' || i, i %% 100, 1.5, 'deposit', 'enqueued' FROM generate_series(1, %d) i;
			CREATE SEQUENCE bench_ids;`, n)
		if _, err := conn.PgConn().Exec(ctx, setup).ReadAll(); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
			b.Fatal(err)
		}
		conn.Close(ctx)
		tps := runPgbench(b, pg.BinDir(), dsn, seedEventSQL, n, *flagPgConns)
		b.ReportMetric(tps, "events/s")
		b.Logf("pgbench of the seed's per-event SQL: %d events, %d clients: %.1f events/s", n, *flagPgConns, tps)
	}
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench runs script for events transactions over clients and returns
// the transactions per second pgbench reports.
func runPgbench(b *testing.B, binDir, dsn, script string, events, clients int) float64 {
	b.Helper()
	dir := b.TempDir()
	path := filepath.Join(dir, "script.sql")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "pgbench"), "-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(clients),
		"-t", strconv.Itoa(events/clients), "-f", path, dsn)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		b.Fatalf("no tps in pgbench output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps
}
