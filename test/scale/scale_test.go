// Package scale runs settle the way it is deployed when one machine is not
// enough: behind PgBouncer in transaction pooling, on Redis Sentinel (with a
// failover under load) and over TLS, and as many replicas of every process.
// Real binaries against real servers from Debian's packages; nothing is
// mocked.
package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Bounds of every run in this package.
const (
	settleTimeout = 3 * time.Minute // loadgen's wait for every event to end
	// Only 18-decimal assets: loadgen makes a conflicting redelivery by
	// appending a digit to the amount, which for a 6-decimal asset can
	// exceed its precision and draw a 400 instead of the 409 it expects.
	loadAssets = "ETH,DAI,WETH"
	// initialBalance lets most withdrawals succeed and some fail for want
	// of funds, so the credit, debit and refusal paths all carry traffic.
	initialBalance = "5"
)

// load is one loadgen run's shape.
type load struct {
	events, users int
	userIDBase    int64
	concurrency   int
	rate          float64 // events per second; 0 = as fast as possible
	withdrawals   int     // percent
	runID         string
}

// runLoad sends a signed mix of deposits, withdrawals, duplicate
// deliveries (later and concurrent), conflicting redeliveries and invalid
// requests through f, waits until every accepted event is terminal and
// checks the run (checkLoad). db is a direct connection (not through any
// pooler), so the checks do not depend on what is under test.
func runLoad(t *testing.T, s *harness.Stack, db *postgres.DB, f *front, l load) loadgen.Result {
	t.Helper()
	res, err := sendLoad(db, f.URL, l)
	return checkLoad(t, s, f, l, res, err)
}

// sendLoad is runLoad's work without the checks, for a goroutine.
func sendLoad(db *postgres.DB, url string, l load) (loadgen.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout+2*time.Minute)
	defer cancel()
	if l.concurrency == 0 {
		l.concurrency = 32
	}
	if l.userIDBase == 0 {
		l.userIDBase = 1
	}
	return loadgen.Run(ctx, loadgen.Config{
		APIURL: url, WebhookSecret: harness.WebhookSecret, AdminToken: harness.AdminToken, DB: db,
		Events: l.events, Rate: l.rate, Concurrency: l.concurrency, Users: l.users, UserIDBase: l.userIDBase,
		Assets: strings.Split(loadAssets, ","), InitialBalance: initialBalance, RunID: l.runID,
		Mix:         loadgen.Mix{Withdrawals: l.withdrawals, Duplicates: 15, ConcurrentDups: 5, Conflicts: 2, Invalid: 2},
		WaitTimeout: settleTimeout, Seed: uint64(len(l.runID)),
	})
}

// checkLoad requires every answer to be the expected one (after the
// front's redelivery of 503s), every distinct event stored exactly once
// and terminal, and the invariants intact.
func checkLoad(t *testing.T, s *harness.Stack, f *front, l load, res loadgen.Result, err error) loadgen.Result {
	t.Helper()
	require.NoError(t, err, "load run %s", l.runID)
	retried := f.retried.Load()
	t.Logf("%s: %d events sent in %.1fs, all terminal %.1fs after the first; answers %v; 503s redelivered %d; outcomes %v; webhook-to-terminal p50 %.0f ms p99 %.0f ms max %.0f ms",
		l.runID, res.Events, res.IngestSeconds, res.SettleSeconds, res.Answers, retried, res.Outcomes,
		res.LatencyMillis["p50"], res.LatencyMillis["p99"], res.LatencyMillis["max"])
	require.Zero(t, res.Unexpected, "answers: %v", res.Answers)
	require.Equal(t, l.events, s.Count(`SELECT count(*) FROM payment_events WHERE event_id LIKE $1`, l.runID+"-%"),
		"every distinct event stored exactly once")
	// A 503 whose transaction committed after all turns that event's
	// "accepted" into a "duplicate" on redelivery; nothing else may.
	accepted := res.Answers["200 accepted"]
	require.LessOrEqual(t, accepted, int64(l.events), "answers: %v", res.Answers)
	require.GreaterOrEqual(t, accepted, int64(l.events)-retried, "answers: %v", res.Answers)
	require.Positive(t, res.Answers["200 duplicate"], "the mix redelivers events")
	require.True(t, res.InvariantsOK, res.InvariantsReport)
	return res
}

// requireBooks checks, on one database, that nothing was lost and nothing
// doubled: every event terminal; a confirmed event has exactly one
// journal row and a failed one none; failures are business outcomes,
// never a dead letter; CONTRACT.md's invariants hold.
func requireBooks(t *testing.T, db *postgres.DB, s *harness.Stack) {
	t.Helper()
	require.Zero(t, s.Count(`SELECT count(*) FROM payment_events WHERE status NOT IN ('confirmed','failed')`), "events not terminal")
	require.Zero(t, s.Count(`SELECT count(*) FROM payment_events p
		WHERE p.status = 'confirmed' AND (SELECT count(*) FROM balance_events b WHERE b.source_event_id = p.event_id) <> 1`),
		"a confirmed event without exactly one journal row")
	require.Zero(t, s.Count(`SELECT count(*) FROM payment_events p
		WHERE p.status = 'failed' AND EXISTS (SELECT 1 FROM balance_events b WHERE b.source_event_id = p.event_id)`),
		"a failed event that moved money")
	require.Zero(t, s.Count(`SELECT count(*) FROM balance_events b
		WHERE NOT EXISTS (SELECT 1 FROM payment_events p WHERE p.event_id = b.source_event_id AND p.status = 'confirmed')`),
		"a journal row whose event is not confirmed")
	require.Zero(t, s.Count(`SELECT count(*) FROM payment_events WHERE status = 'failed' AND outcome IS DISTINCT FROM 'insufficient_funds'`),
		"an event failed for a reason other than insufficient funds (a dead letter means it was lost to the pipeline)")
	report, err := invariant.Check(context.Background(), db, invariant.Quiet())
	require.NoError(t, err)
	require.True(t, report.OK(), report.String())
}

// jobRuns reads the scheduler's "job ran" log lines and requires every
// claimed (job, period) to have run once across all the given processes.
func jobRuns(t *testing.T, schedulers ...*harness.Proc) (runs int) {
	t.Helper()
	seen := map[string]string{}
	for _, p := range schedulers {
		for _, line := range strings.Split(p.Logs(), "\n") {
			if !strings.Contains(line, `"message":"job ran"`) {
				continue
			}
			var entry map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
			if entry["local"] == true {
				continue // runs on every replica by design (gauge refreshes)
			}
			job, period := logField(entry, "job"), logField(entry, "period")
			require.NotEmpty(t, job, line)
			require.NotEmpty(t, period, line)
			key := job + "@" + period
			require.NotContains(t, seen, key, "%s ran on %s and again on %s", key, seen[key], p.Name)
			seen[key] = p.Name
			runs++
		}
	}
	return runs
}

func logField(entry map[string]any, name string) string {
	switch v := entry[name].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// databaseName is the database a DSN names.
func databaseName(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return strings.TrimPrefix(u.Path, "/")
}

// tailText is the last n lines of text.
func tailText(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stopAll stops the stack's processes gracefully; servers a test started
// after the stack use it so that they outlive their clients.
func stopAll(s *harness.Stack) {
	for _, p := range s.Procs {
		if p.Running() {
			p.Stop(15 * time.Second)
		}
	}
}
