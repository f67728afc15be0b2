package scan

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/pkg/tracing"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestCursorPassContractWindows: cursor passes over a real dev chain
// (HTTP JSON-RPC) into real PostgreSQL with more addresses registered
// than one recipient filter holds, so tokens are read by contract in
// windows and matched by owners queries. Behind a provider that refuses
// ranges wider than 4 blocks with "query returned more than 10000
// results", and with settle's own cap of one log per answer, every
// transfer to a registered address is stored exactly once and the
// transfers to unregistered addresses among them are not.
func TestCursorPassContractWindows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	token, _, err := ch.DeployToken(ctx, 0)
	require.NoError(t, err)
	const network, registeredCount = "ETH_MAINNET", 50
	registered := make([]string, registeredCount)
	for i := range registered {
		registered[i] = fmt.Sprintf("0x%040x", 0xa000+i)
	}
	start, err := ch.Head(ctx)
	require.NoError(t, err)
	var want []string
	for i := range 30 {
		to := fmt.Sprintf("0x%040x", 0xf000+i) // nobody's
		if i%3 != 0 {
			to = registered[i]
		}
		tx, err := ch.TransferToken(ctx, 0, token, to, big.NewInt(int64(1_000_000*(i+1))))
		require.NoError(t, err)
		if i%3 != 0 {
			want = append(want, payment.Transfer{Network: network, TxHash: tx.Hash, Index: payment.LogIndexTransfer(0)}.EventID())
		}
		if i%10 == 5 {
			eth, err := ch.SendETH(ctx, 0, registered[i], big.NewInt(1e15))
			require.NoError(t, err)
			want = append(want, payment.Transfer{Network: network, TxHash: eth.Hash, Index: payment.TransferNative}.EventID())
		}
	}
	head, err := ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, ch.FinalizeThrough(ctx, head))
	slices.Sort(want)

	for _, c := range []struct {
		name    string
		limit   *devchain.LogsLimit
		logsMax int
	}{
		{"provider refuses ranges over 4 blocks", &devchain.InfuraTooManyResults, 0},
		{"answers over the log cap", nil, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := ch.URL()
			var proxy *devchain.LogsLimitProxy
			if c.limit != nil {
				limit := *c.limit
				limit.BlocksMax = 4
				proxy, err = devchain.NewLogsLimitProxy(ch.URL(), limit)
				require.NoError(t, err)
				t.Cleanup(func() { _ = proxy.Close() })
				url = proxy.URL()
			}
			client, err := chain.Dial(ctx, url, chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
			require.NoError(t, err)
			t.Cleanup(client.Close)

			dsn := testenv.DatabaseURL(t)
			db := testenv.OpenDB(t, dsn)
			conn, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			_, err = conn.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('TOK', $1, $2, 6)`, network, token)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, `INSERT INTO users (id) SELECT generate_series(1, $1::bigint)`, registeredCount)
			require.NoError(t, err)
			for i, a := range registered {
				_, err = conn.Exec(ctx, `INSERT INTO deposit_addresses (network, address, user_id) VALUES ($1, $2, $3)`, network, a, i+1)
				require.NoError(t, err)
			}
			require.NoError(t, db.InitScanCursor(ctx, network, start+1))

			// The first case runs with tracing on (an in-memory recorder).
			recorder := tracetest.NewSpanRecorder()
			if proxy != nil {
				defer tracing.Use(tracing.NewProvider(sdktrace.WithSpanProcessor(recorder)))()
			}
			reg := prometheus.NewRegistry()
			n := Network{Name: network, RPC: client, Policy: chain.FinalizedPolicy()}
			// 10 addresses per call: 50 registered is "many", read by contract.
			s := New(Options{Store: db, Owner: "test", Networks: []Network{n}, AddressesPerCall: 10, LogWindow: 16,
				LogsMax: c.logsMax, Registerer: reg, Log: zerolog.Nop()})
			for more, passes := true, 0; more; passes++ {
				require.Less(t, passes, 100)
				more, err = s.CursorPass(ctx, n)
				require.NoError(t, err)
			}

			rows, err := conn.Query(ctx, `SELECT event_id FROM payment_events WHERE source = 'scanner' ORDER BY event_id`)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, want, got, "every deposit, nothing for the unregistered")
			requirePassTraces(t, conn, recorder, proxy != nil)
			require.Equal(t, float64(len(want)), counterValue(t, reg, "settle_scan_deposits_total", SourceScanner))
			require.Zero(t, counterValue(t, reg, "settle_scan_deposits_total", SourceReported), "no transfer found twice")
			require.Positive(t, counterValue(t, reg, "settle_scan_logs_refused_total", ""), "windows were refused and shrunk")
			if proxy != nil {
				require.Positive(t, proxy.Refused())
			}
		})
	}
}

// requirePassTraces: every deposit a pass stores carries the pass's
// trace id, W3C-shaped (32 hex digits), shared by the pass's deposits and
// no other pass's; with tracing on, its traceparent names the pass's
// "scan pass" span, so the worker's spans of the deposit join that trace.
func requirePassTraces(t *testing.T, conn *pgx.Conn, recorder *tracetest.SpanRecorder, on bool) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT trace_id, COALESCE(traceparent, '') FROM payment_events WHERE source = 'scanner'`)
	require.NoError(t, err)
	type traced struct{ id, parent string }
	stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (traced, error) {
		var v traced
		return v, r.Scan(&v.id, &v.parent)
	})
	require.NoError(t, err)
	passes, spans := map[string]string{}, 0 // span id by trace id, from the recorder
	for _, sp := range recorder.Ended() {
		if sp.Name() == "scan pass" {
			passes[sp.SpanContext().TraceID().String()] = sp.SpanContext().SpanID().String()
			spans++
		}
	}
	require.Len(t, passes, spans, "each pass a trace of its own")
	ids := map[string]bool{}
	for _, v := range stored {
		require.Regexp(t, `^[0-9a-f]{32}$`, v.id)
		ids[v.id] = true
		if !on {
			require.Empty(t, v.parent, "tracing off: no traceparent")
			continue
		}
		require.Equal(t, v.id, tracing.TraceID(v.parent), "the traceparent is in the deposit's trace")
		require.Contains(t, passes, v.id, "a scan pass span of that trace was recorded")
		require.Equal(t, "00-"+v.id+"-"+passes[v.id]+"-01", v.parent)
	}
	require.NotEmpty(t, ids)
	if on {
		require.Positive(t, spans)
	}
}

// counterValue sums a counter's series whose labels include the value
// (any series when value is empty).
func counterValue(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := value == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == value
			}
			if match {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// devScanFixture is a scanner over a manual dev chain (blocks only when
// asked) into real PostgreSQL, with user 1 owning the registered
// addresses of network.
type devScanFixture struct {
	ch      *devchain.Chain
	client  *chain.Client
	conn    *pgx.Conn
	db      *postgres.DB
	scanner *Scanner
	n       Network
	reg     *prometheus.Registry
	dsn     string
}

func newDevScanFixture(t *testing.T, ctx context.Context, network string, registered []string) *devScanFixture {
	t.Helper()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	client, err := chain.Dial(ctx, ch.URL(), chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	dsn := testenv.DatabaseURL(t)
	db := testenv.OpenDB(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `INSERT INTO users (id) VALUES (1)`)
	require.NoError(t, err)
	for _, a := range registered {
		_, err = conn.Exec(ctx, `INSERT INTO deposit_addresses (network, address, user_id) VALUES ($1, $2, 1)`, network, a)
		require.NoError(t, err)
	}
	reg := prometheus.NewRegistry()
	n := Network{Name: network, RPC: client, Policy: chain.FinalizedPolicy()}
	s := New(Options{Store: db, Owner: "dev-scan", Registerer: reg, Networks: []Network{n}, Log: zerolog.Nop()})
	return &devScanFixture{ch: ch, client: client, conn: conn, db: db, scanner: s, n: n, reg: reg, dsn: dsn}
}

// drain runs cursor passes until the scanner is at its finality head.
func (f *devScanFixture) drain(t *testing.T, ctx context.Context) {
	t.Helper()
	for more, passes := true, 0; more; passes++ {
		require.Less(t, passes, 100)
		var err error
		more, err = f.scanner.CursorPass(ctx, f.n)
		require.NoError(t, err)
	}
}

// TestScannerReopensReorgedDeposit: a deposit the scanner stored ended
// failed/reorged (receipt seen, then gone past FINALITY_TIMEOUT), yet
// its transaction is final on the chain. A rescan of its block finds the
// very transfer again: the deposit is reopened (the contract: "the
// scanner finds it"), counted as source reopened. So is one that ended
// not_found.
func TestScannerReopensReorgedDeposit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d17"
	f := newDevScanFixture(t, ctx, network, []string{to})

	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
	tx, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	f.drain(t, ctx)
	id := payment.Transfer{Network: network, TxHash: tx.Hash, Index: payment.TransferNative}.EventID()
	state := func() string {
		t.Helper()
		var status, outcome string
		require.NoError(t, f.conn.QueryRow(ctx, `SELECT status, COALESCE(outcome, '') FROM payment_events WHERE event_id = $1`, id).Scan(&status, &outcome))
		return status + "/" + outcome
	}
	require.Equal(t, "pending/", state(), "the scanner stored the deposit")

	_, err = f.conn.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'reorged', chain_state = 'reorged',
		error = 'receipt seen, then gone; not back within 1h' WHERE event_id = $1`, id)
	require.NoError(t, err)

	job, err := f.db.CreateRescan(ctx, "rescan-reopen", network, tx.BlockNumber, tx.BlockNumber, "operator")
	require.NoError(t, err)
	did, err := f.scanner.RescanPass(ctx, f.n)
	require.NoError(t, err)
	require.True(t, did)
	done, err := f.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "done", done.Status)
	require.Equal(t, 1, done.Found)
	require.Equal(t, "pending/", state(), "found canonical and final again, the reorged deposit is reopened")
	require.InDelta(t, 1, counterValue(t, f.reg, "settle_scan_deposits_total", SourceReopened), 0)

	// Dropped before it was ever seen and mined again past
	// FINALITY_TIMEOUT: not_found, and final on the chain all the same.
	_, err = f.conn.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'not_found', chain_state = NULL,
		error = 'transaction not found within 1h' WHERE event_id = $1`, id)
	require.NoError(t, err)
	_, err = f.db.CreateRescan(ctx, "rescan-not-found", network, tx.BlockNumber, tx.BlockNumber, "operator")
	require.NoError(t, err)
	did, err = f.scanner.RescanPass(ctx, f.n)
	require.NoError(t, err)
	require.True(t, did)
	require.Equal(t, "pending/", state(), "found final, the not_found deposit is reopened")
	require.InDelta(t, 2, counterValue(t, f.reg, "settle_scan_deposits_total", SourceReopened), 0)
}

// TestScannerFollowsHeadMinusN: under confirmations:N the scanner follows
// head − N (the contract). Under confirmations:2 a fork replacing the two
// newest blocks mines a deposit that sat above the cursor into the lower
// replaced height: with the cursor at head − 2 that height was not
// scanned yet, and the deposit is found there. (Following head − (N−1),
// the cursor had passed it and the deposit was never scanned.)
func TestScannerFollowsHeadMinusN(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d18"
	f := newDevScanFixture(t, ctx, network, []string{to})
	policy, err := chain.ConfirmationsPolicy(2)
	require.NoError(t, err)
	f.n.Policy = policy
	f.scanner.networks[network] = f.n

	require.NoError(t, f.ch.CommitBlocks(ctx, 3))
	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
	dropped, err := f.ch.SendETH(ctx, 0, "0x00000000000000000000000000000000000b0b0b", big.NewInt(1))
	require.NoError(t, err)
	deposit, err := f.ch.SendETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.Equal(t, dropped.BlockNumber+1, deposit.BlockNumber)

	head, ok, err := f.client.FinalityHead(ctx, policy)
	require.NoError(t, err)
	require.True(t, ok)
	latest, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.Equal(t, latest-2, head, "head − N")
	f.drain(t, ctx)

	reorg, err := f.ch.Reorg(ctx, dropped.Hash)
	require.NoError(t, err)
	receipt, err := f.client.Receipt(ctx, deposit.Hash)
	require.NoError(t, err)
	t.Logf("fork at %d; the deposit is now in block %d; new head %d", reorg.ForkedAt, receipt.BlockNumber, reorg.NewHead)
	require.NoError(t, f.ch.CommitBlocks(ctx, 3))
	f.drain(t, ctx)
	id := payment.Transfer{Network: network, TxHash: deposit.Hash, Index: payment.TransferNative}.EventID()
	var n int
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
	require.Equal(t, 1, n, "the deposit, canonical in block %d, was never scanned", receipt.BlockNumber)
}

// TestFirstRunStartsAtTheHead: the first run for a network starts at the
// current finality head, that block included (the contract), and no
// earlier: a deposit in the head block is found by the next pass; one
// below it is history nobody asked for.
func TestFirstRunStartsAtTheHead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d19"
	f := newDevScanFixture(t, ctx, network, []string{to})
	// The dev chain finalizes whole epochs: the deposit lands on the
	// epoch's last block, the other just below it.
	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.CommitBlocks(ctx, int(devchain.EpochBlocks-2-start)))
	before, err := f.ch.SendETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	tx, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.Greater(t, tx.BlockNumber, before.BlockNumber)
	require.NoError(t, f.ch.FinalizeThrough(ctx, tx.BlockNumber))
	head, ok, err := f.client.FinalityHead(ctx, chain.FinalizedPolicy())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tx.BlockNumber, head)

	more, err := f.scanner.CursorPass(ctx, f.n) // first run
	require.NoError(t, err)
	require.False(t, more)
	next, _, found, err := f.db.ScanCursor(ctx, network)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, head, next, "the first run starts at the current finality head (%d), not after it", head)
	require.InDelta(t, 1, gaugeValue(t, f.reg, "settle_scan_head_lag_blocks"), 0, "the head block is still to scan")

	f.drain(t, ctx)
	for hash, want := range map[string]int{tx.Hash: 1, before.Hash: 0} {
		id := payment.Transfer{Network: network, TxHash: hash, Index: payment.TransferNative}.EventID()
		var n int
		require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
		require.Equal(t, want, n, hash)
	}
}

// TestLagSetWithItsTime: every pass that reads the finality head and the
// cursor sets the lag and when it was set, a pass another replica's lease
// skips included; a pass that reads neither leaves both, so the alerts
// can tell a stale lag from a fresh one.
func TestLagSetWithItsTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	f := newDevScanFixture(t, ctx, network, []string{"0x00000000000000000000000000000000000a0d1a"})
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	const updated = "settle_scan_lag_updated_timestamp_seconds"

	before := float64(time.Now().UnixNano()) / 1e9
	// Before any pass nothing says when the head was read: the first pass
	// asks the database (TestHeadReadOutlivesARestart).
	require.False(t, hasGauge(t, f.reg, updated), "not set before the database is asked")
	_, err = f.scanner.CursorPass(ctx, f.n) // first run
	require.NoError(t, err)
	first := gaugeValue(t, f.reg, updated)
	require.GreaterOrEqual(t, first, before, "the first run set the lag")

	// Another replica holds the cursor: this pass is skipped, yet it read
	// the lag and says so.
	_, ok, err := f.db.ClaimScanCursor(ctx, network, "other-replica", time.Minute, 1, head)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = f.scanner.CursorPass(ctx, f.n)
	require.NoError(t, err)
	skipped := gaugeValue(t, f.reg, updated)
	require.Greater(t, skipped, first, "a skipped pass set the lag too")
	require.InDelta(t, 1, gaugeValue(t, f.reg, "settle_scan_head_lag_blocks"), 0)

	// A pass that cannot read the head leaves the lag and its time.
	dead, stop := context.WithCancel(ctx)
	stop()
	_, err = f.scanner.CursorPass(dead, f.n)
	require.Error(t, err)
	require.Equal(t, skipped, gaugeValue(t, f.reg, updated))
}

// TestHeadReadOutlivesARestart: when the finality head was last read is
// kept in the database, so a restarted scheduler whose node answers no
// head (syncing, no finalized tag) exports that time, not its own start:
// a restart, or a crash loop, neither clears SettleScannerHeadUnread nor
// starts its count again. A network never read counts from the first
// start of a scanner following it; a database that does not answer at
// start leaves this process's start until it does.
func TestHeadReadOutlivesARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const updated = "settle_scan_lag_updated_timestamp_seconds"
	f := newDevScanFixture(t, ctx, network, nil)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	stored := func(network string) float64 {
		t.Helper()
		var at time.Time
		require.NoError(t, f.conn.QueryRow(ctx, `SELECT read_at FROM scan_head_reads WHERE network = $1`, network).Scan(&at))
		return unixSeconds(at)
	}

	_, err = f.scanner.CursorPass(ctx, f.n)
	require.NoError(t, err)
	// Recorded on the database's clock, the gauge set on this process's.
	read := stored(network)
	require.InDelta(t, gaugeValue(t, f.reg, updated), read, 1, "the pass recorded its head read")
	// Another pass within the interval reads the head again but does not
	// write it.
	_, err = f.scanner.CursorPass(ctx, f.n)
	require.NoError(t, err)
	require.Greater(t, gaugeValue(t, f.reg, updated), read)
	require.InDelta(t, read, stored(network), 1e-5, "one write an interval")

	// The node now answers no head (a chain shorter than the policy's
	// confirmations), and the scheduler restarts, twice.
	noHead, err := chain.ConfirmationsPolicy(chain.ConfirmationsMax)
	require.NoError(t, err)
	restart := func(name string, store Store) (*Scanner, Network, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		n := Network{Name: name, RPC: f.client, Policy: noHead}
		return New(Options{Store: store, Owner: "restarted", Registerer: reg, Networks: []Network{n}, Log: zerolog.Nop()}), n, reg
	}
	for range 2 {
		s, n, reg := restart(network, f.db)
		more, err := s.CursorPass(ctx, n)
		require.NoError(t, err)
		require.False(t, more)
		require.Greater(t, unixSeconds(s.started), read)
		require.InDelta(t, read, gaugeValue(t, reg, updated), 1e-5, "a restart says when the head was last read, not when it started")
	}

	// A network never read: the first start, across restarts.
	const never = "BASE_MAINNET"
	first, n, reg := restart(never, f.db)
	_, err = first.CursorPass(ctx, n)
	require.NoError(t, err)
	firstStart := gaugeValue(t, reg, updated)
	require.InDelta(t, unixSeconds(first.started), firstStart, 1)
	again, n, reg := restart(never, f.db)
	_, err = again.CursorPass(ctx, n)
	require.NoError(t, err)
	require.InDelta(t, firstStart, gaugeValue(t, reg, updated), 1e-5, "counted from the first start")

	// The database does not answer at start: this process's start, and
	// the database's time once it answers.
	down, err := postgres.Open(ctx, f.dsn, postgres.Options{ConnsMax: 1})
	require.NoError(t, err)
	down.Close()
	s, n, reg := restart(network, down)
	_, err = s.CursorPass(ctx, n)
	require.NoError(t, err, "an idle pass needs no database")
	require.InDelta(t, unixSeconds(s.started), gaugeValue(t, reg, updated), 1e-6, "the start while the database is down")
	s.opts.Store = f.db
	_, err = s.CursorPass(ctx, n)
	require.NoError(t, err)
	require.InDelta(t, read, gaugeValue(t, reg, updated), 1e-5, "the database's time once it answers")
}

func hasGauge(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return true
		}
	}
	return false
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single %s gauge", name)
	return 0
}

// TestSettingsExported: each network the scanner follows exports its
// interval and pass timeout, defaults filled in, which the scanner alerts
// size their bounds from.
func TestSettingsExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(Options{
		Networks:   []Network{{Name: "ETH_MAINNET"}, {Name: "BASE_MAINNET"}},
		Interval:   10 * time.Minute,
		Registerer: reg,
	})
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]map[string]float64{}
	for _, f := range families {
		if f.GetName() != "settle_scan_interval_seconds" && f.GetName() != "settle_scan_pass_timeout_seconds" {
			continue
		}
		got[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			require.Len(t, m.GetLabel(), 1)
			got[f.GetName()][m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	require.Equal(t, map[string]map[string]float64{
		"settle_scan_interval_seconds":     {"ETH_MAINNET": 600, "BASE_MAINNET": 600},
		"settle_scan_pass_timeout_seconds": {"ETH_MAINNET": PassTimeoutDefault.Seconds(), "BASE_MAINNET": PassTimeoutDefault.Seconds()},
	}, got)
}

// TestLaggingLogsIndexFailsThePass: behind a balancer one backend's log
// index lags and answers eth_getLogs over the range with an empty list
// while its blocks (from another backend) show a token deposit. The
// blocks' blooms admit that Transfer, so the block is asked again by its
// hash, the deposit is there, and the pass fails instead of moving the
// cursor past it; the next pass, answered in full, stores it. Asked by
// recipient (few addresses) and by contract (many) alike. Blocks whose
// blooms admit nothing of the token are not asked again.
func TestLaggingLogsIndexFailsThePass(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name             string
		addressesPerCall int
	}{
		{"asked by recipient", 0},
		{"asked by contract", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			const network = "ETH_MAINNET"
			to, other := "0x00000000000000000000000000000000000a0e01", "0x00000000000000000000000000000000000a0e02"
			f := newDevScanFixture(t, ctx, network, []string{to, other})
			token, _, err := f.ch.DeployToken(ctx, 0)
			require.NoError(t, err)
			_, err = f.conn.Exec(ctx, `INSERT INTO assets (code, network, contract_address, decimals) VALUES ('TOK', $1, $2, 6)`, network, token)
			require.NoError(t, err)
			proxy, err := devchain.NewProxy(f.ch.URL())
			require.NoError(t, err)
			t.Cleanup(func() { _ = proxy.Close() })
			client, err := chain.Dial(ctx, proxy.URL(), chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
			require.NoError(t, err)
			t.Cleanup(client.Close)
			reg := prometheus.NewRegistry()
			n := Network{Name: network, RPC: client, Policy: chain.FinalizedPolicy()}
			scanner := New(Options{Store: f.db, Owner: "dev-scan", Registerer: reg, Networks: []Network{n}, Log: zerolog.Nop(),
				AddressesPerCall: c.addressesPerCall})

			start, err := f.ch.Head(ctx)
			require.NoError(t, err)
			require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
			require.NoError(t, f.ch.CommitBlocks(ctx, 3)) // blocks with no logs at all
			tx, err := f.ch.TransferToken(ctx, 0, token, to, big.NewInt(2_000_000))
			require.NoError(t, err)
			head, err := f.ch.Head(ctx)
			require.NoError(t, err)
			require.NoError(t, f.ch.FinalizeThrough(ctx, head))
			id := payment.Transfer{Network: network, TxHash: tx.Hash, Index: payment.LogIndexTransfer(0)}.EventID()

			// Every range query answers empty; by-hash queries pass.
			proxy.Answer("eth_getLogs", "", json.RawMessage("[]"), 1)
			before := proxy.Calls("eth_getLogs")
			next, _, _, err := f.db.ScanCursor(ctx, network)
			require.NoError(t, err)
			_, err = scanner.CursorPass(ctx, n)
			require.ErrorIs(t, err, payment.ErrUnavailable)
			require.ErrorContains(t, err, "a lagging backend")
			require.EqualValues(t, 2, proxy.Calls("eth_getLogs")-before, "the range, then the one block whose bloom admits the deposit")
			again, _, _, err := f.db.ScanCursor(ctx, network)
			require.NoError(t, err)
			require.Equal(t, next, again, "the cursor did not pass the deposit")
			_, err = f.db.Event(ctx, id)
			require.ErrorIs(t, err, payment.ErrNotFound)

			for more, passes := true, 0; more; passes++ {
				require.Less(t, passes, 100)
				more, err = scanner.CursorPass(ctx, n)
				require.NoError(t, err)
			}
			_, err = f.db.Event(ctx, id)
			require.NoError(t, err, "stored once the answers are whole")
		})
	}
}

// TestReorgBelowTheCursorIsRescanned: under confirmations:2 a fork deeper
// than the policy replaces blocks the cursor has passed with a branch
// holding a deposit the old one never had. The next cursor pass finds the
// block below its range replaced and asks for a rescan of the blocks
// below it (once: the passes after it compare with the new branch's
// hashes), which stores the deposit.
func TestReorgBelowTheCursorIsRescanned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d19"
	f := newDevScanFixture(t, ctx, network, []string{to})
	policy, err := chain.ConfirmationsPolicy(2)
	require.NoError(t, err)
	f.n.Policy = policy
	f.scanner.networks[network] = f.n
	f.scanner.opts.ReorgRescan = 16

	require.NoError(t, f.ch.CommitBlocks(ctx, 3))
	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, start+1))
	require.NoError(t, f.ch.CommitBlocks(ctx, 8))
	f.drain(t, ctx)
	next, _, _, err := f.db.ScanCursor(ctx, network)
	require.NoError(t, err)

	// Deeper than two confirmations: the new branch replaces heights the
	// cursor left, and the deposit is mined at one of them.
	parent := next - 4
	oldHead, err := f.ch.ForkAt(ctx, parent)
	require.NoError(t, err)
	_, err = f.ch.QueueETH(ctx, 1, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.NoError(t, f.ch.CommitBlocks(ctx, int(oldHead-parent)+1))
	var deposit string
	for n := parent + 1; n < next && deposit == ""; n++ {
		_, txs, err := f.client.BlockTxHashes(ctx, n)
		require.NoError(t, err)
		if len(txs) > 0 {
			deposit = txs[0]
		}
	}
	require.NotEmpty(t, deposit, "the deposit is mined below the cursor")
	id := payment.Transfer{Network: network, TxHash: deposit, Index: payment.TransferNative}.EventID()
	stored := func() int {
		var n int
		require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
		return n
	}

	f.drain(t, ctx)
	require.Zero(t, stored(), "the cursor passes never read below themselves")
	var jobs int
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM rescan_jobs WHERE network = $1 AND operator LIKE 'settle: %' AND to_block = $2 - 1`, network, next).Scan(&jobs))
	require.Equal(t, 1, jobs, "one rescan of the blocks below the cursor")
	require.InDelta(t, 1, counterValue(t, f.reg, "settle_scan_reorgs_below_cursor_total", ""), 0)
	require.NoError(t, f.ch.CommitBlocks(ctx, 3))
	f.drain(t, ctx)
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM rescan_jobs WHERE network = $1`, network).Scan(&jobs))
	require.Equal(t, 1, jobs, "asked once")
	for did := true; did; {
		did, err = f.scanner.RescanPass(ctx, f.n)
		require.NoError(t, err)
	}
	require.Equal(t, 1, stored(), "the rescan finds the deposit the new branch holds")
}

// TestRescanAboveTheHeadWaitsAside: an operator's rescan whose range lies
// far above the finality head (a typo; the api cannot know the head) is
// the oldest job. It waits, says so (waiting_head, the gauge), and a later
// rescan of the same network runs past it and stores its deposit.
func TestRescanAboveTheHeadWaitsAside(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d77"
	f := newDevScanFixture(t, ctx, network, []string{to})

	// The cursor starts past the deposit: only a rescan finds it.
	tx, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	require.NoError(t, f.db.InitScanCursor(ctx, network, head+1))

	future, err := f.db.CreateRescan(ctx, "rescan-future", network, head+1_000_000, head+1_000_100, "operator-typo")
	require.NoError(t, err)
	job, err := f.db.CreateRescan(ctx, "rescan-real", network, tx.BlockNumber, tx.BlockNumber, "operator")
	require.NoError(t, err)

	for range 3 {
		f.scanner.Tick(ctx)
	}
	got, err := f.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "done", got.Status, "the later rescan runs past the one waiting for the chain")
	require.Nil(t, got.WaitingHead)
	id := payment.Transfer{Network: network, TxHash: tx.Hash, Index: payment.TransferNative}.EventID()
	var n int
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)

	waiting, err := f.db.Rescan(ctx, future.ID)
	require.NoError(t, err)
	require.Equal(t, "running", waiting.Status)
	require.NotNil(t, waiting.WaitingHead, "the job says it waits for the chain")
	finalized, err := f.ch.Finalized(ctx)
	require.NoError(t, err)
	require.Equal(t, finalized, *waiting.WaitingHead)
	require.InDelta(t, 1, gaugeValue(t, f.reg, "settle_scan_rescans_waiting"), 0)

	require.NoError(t, f.db.CancelRescan(ctx, future.ID, "operator", "typo"))
	f.scanner.Tick(ctx)
	waiting, err = f.db.Rescan(ctx, future.ID)
	require.NoError(t, err)
	require.Equal(t, "failed", waiting.Status)
	require.Nil(t, waiting.WaitingHead)
	require.InDelta(t, 0, gaugeValue(t, f.reg, "settle_scan_rescans_waiting"), 0)
}

// TestRescansOfOneNetworkDoNotWaitForAnothersNode: the oldest rescan is
// BASE_MAINNET's, whose node is down; ETH_MAINNET's later rescan still
// runs (one network's outage delays only that network).
func TestRescansOfOneNetworkDoNotWaitForAnothersNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d78"
	f := newDevScanFixture(t, ctx, network, []string{to})
	dead, err := chain.Dial(ctx, "http://127.0.0.1:1", chain.ClientOptions{Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(dead.Close)
	s := New(Options{Store: f.db, Owner: "dev-scan-2", Registerer: prometheus.NewRegistry(), Log: zerolog.Nop(),
		Networks: []Network{f.n, {Name: "BASE_MAINNET", RPC: dead, Policy: chain.FinalizedPolicy()}}})

	tx, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	require.NoError(t, f.db.InitScanCursor(ctx, network, head+1))

	base, err := f.db.CreateRescan(ctx, "rescan-base", "BASE_MAINNET", 100, 200, "operator")
	require.NoError(t, err)
	job, err := f.db.CreateRescan(ctx, "rescan-eth", network, tx.BlockNumber, tx.BlockNumber, "operator")
	require.NoError(t, err)
	for range 3 {
		s.Tick(ctx)
	}
	got, err := f.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "done", got.Status, "ETH_MAINNET's rescan does not wait for BASE_MAINNET's node")
	got, err = f.db.Rescan(ctx, base.ID)
	require.NoError(t, err)
	require.Equal(t, "running", got.Status)
	require.EqualValues(t, 100, got.NextBlock)
}

// TestLongRescanTakesTurns: a long rescan (a large backfill alike) asked
// first does not hold a later one back until it ends: the jobs take
// turns, so the later one is done within a tick while the long one still
// runs.
func TestLongRescanTakesTurns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const to = "0x00000000000000000000000000000000000a0d79"
	f := newDevScanFixture(t, ctx, network, []string{to})
	f.scanner.opts.BlocksMax = 1

	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.CommitBlocks(ctx, 8))
	tx, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))
	require.NoError(t, f.db.InitScanCursor(ctx, network, head+1))

	long, err := f.db.CreateRescan(ctx, "rescan-long", network, start, head, "operator")
	require.NoError(t, err)
	job, err := f.db.CreateRescan(ctx, "rescan-short", network, tx.BlockNumber, tx.BlockNumber, "operator")
	require.NoError(t, err)
	f.scanner.Tick(ctx)
	got, err := f.db.Rescan(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "done", got.Status, "the later job's turn came within the tick")
	got, err = f.db.Rescan(ctx, long.ID)
	require.NoError(t, err)
	require.Equal(t, "running", got.Status)
	require.EqualValues(t, start+rescanPassesMax-1, got.NextBlock, "one pass each in turn, then the long one's")
}

// TestTickOnAFrozenDatabaseEnds: a PostgreSQL that stops answering
// mid-call without a reset (a failover, a partition) ends an interval's
// work at the pass bound, the statements between the passes included
// (the backfill ends' resolution, the rescan jobs' networks), instead of
// holding every network's scan until the kernel gives the socket up.
func TestTickOnAFrozenDatabaseEnds(t *testing.T) {
	freezer, dsn := testenv.NewFreezer(t, testenv.DatabaseURL(t))
	db := testenv.OpenDB(t, dsn)
	const bound = 200 * time.Millisecond
	// A node with no finality head yet: the cursor pass asks PostgreSQL
	// nothing, the statements after it do.
	s := New(Options{Store: db, Owner: "frozen", PassTimeout: bound, Log: zerolog.Nop(),
		Networks: []Network{{Name: "ETH_MAINNET", RPC: noHeadRPC{}, Policy: chain.FinalizedPolicy()}}})
	freezer.Freeze()
	defer freezer.Thaw() // before the pool's Close, which waits for the calls
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		s.Tick(context.Background()) // Run's context has no deadline either
	}()
	select {
	case <-done:
	case <-time.After(25 * bound):
		t.Fatalf("the interval's work still waits on a frozen PostgreSQL after %s (a pass's bound is %s)", time.Since(start).Round(time.Millisecond), bound)
	}
}

// slowRPC is a node that answers, slowly: each finality head it is asked
// for comes after delay (or the caller's deadline, whichever is first).
type slowRPC struct {
	RPC
	delay time.Duration
}

func (r slowRPC) FinalityHead(ctx context.Context, p chain.Policy) (uint64, bool, error) {
	select {
	case <-ctx.Done():
		return 0, false, ctx.Err()
	case <-time.After(r.delay):
	}
	return r.RPC.FinalityHead(ctx, p)
}

// TestSlowNetworkHoldsNoOtherBack: BASE_MAINNET's node answers, slowly,
// and its cursor is far behind, so each interval it runs its catch-up
// passes back to back, every one of them slow. ETH_MAINNET's deposits are
// still found within an interval or so, the first and the next one alike:
// each network runs on its own. Run then ends with its context.
func TestSlowNetworkHoldsNoOtherBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network, slow = "ETH_MAINNET", "BASE_MAINNET" // the slow one sorts first
	const to = "0x00000000000000000000000000000000000a0d7a"
	const interval, passTimeout, delay, blocksMax = 100 * time.Millisecond, 2 * time.Second, 400 * time.Millisecond, 8
	// Well under the slow network's catch-up (catchUpPassesMax passes of
	// at least delay each), which it spends before its turn ends.
	const within = 3 * time.Second
	require.Greater(t, catchUpPassesMax*delay, 2*within)
	f := newDevScanFixture(t, ctx, network, []string{to})

	// The slow network is behind by more than its passes of one interval.
	start, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.CommitBlocks(ctx, 2*catchUpPassesMax*blocksMax))
	require.NoError(t, f.db.InitScanCursor(ctx, slow, start+1))
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.db.InitScanCursor(ctx, network, head+1))
	first, err := f.ch.SendETH(ctx, 0, to, big.NewInt(1e15))
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, first.BlockNumber))

	s := New(Options{Store: f.db, Owner: "dev-scan-slow", Registerer: prometheus.NewRegistry(), Log: zerolog.Nop(),
		Interval: interval, PassTimeout: passTimeout, BlocksMax: blocksMax,
		Networks: []Network{f.n, {Name: slow, RPC: slowRPC{RPC: f.client, delay: delay}, Policy: chain.FinalizedPolicy()}}})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(runCtx)
	}()
	found := func(tx devchain.Tx, which string) {
		t.Helper()
		id := payment.Transfer{Network: network, TxHash: tx.Hash, Index: payment.TransferNative}.EventID()
		since := time.Now()
		for {
			var n int
			require.NoError(t, f.conn.QueryRow(ctx, `SELECT count(*) FROM payment_events WHERE event_id = $1`, id).Scan(&n))
			if n == 1 {
				return
			}
			if time.Since(since) > within {
				t.Fatalf("%s deposit of %s not found %s after it was final: it waits for %s's slow passes", which, network, within, slow)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	found(first, "the first")
	second, err := f.ch.SendETH(ctx, 0, to, big.NewInt(2e15))
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, second.BlockNumber))
	found(second, "the next")
	// The slow network moves too, at its own pace (ETH_MAINNET's two
	// deposits may be found before its first pass ends).
	require.Eventually(t, func() bool {
		next, _, _, err := f.db.ScanCursor(ctx, slow)
		require.NoError(t, err)
		return next > start+1
	}, within, 20*time.Millisecond, "the slow network moves too")

	stop()
	select {
	case <-done:
	case <-time.After(passTimeout + time.Second):
		t.Fatal("Run did not end with its context")
	}
}

// noHeadRPC is a node that has no finality head yet; it is asked nothing else.
type noHeadRPC struct{ RPC }

func (noHeadRPC) FinalityHead(context.Context, chain.Policy) (uint64, bool, error) {
	return 0, false, nil
}

// TestHeadReadOfASkewedReplicaDoesNotOutliveItsClock: the time of a head
// read kept in the database is the database's, not the reading replica's.
// A replica whose clock ran an hour ahead recorded its read an hour in
// the future, and the record never moves back: every scheduler restarted
// while the node answers no head then exported that time, and
// SettleScannerHeadUnread stayed quiet for the hour.
func TestHeadReadOfASkewedReplicaDoesNotOutliveItsClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const network = "ETH_MAINNET"
	const updated = "settle_scan_lag_updated_timestamp_seconds"
	f := newDevScanFixture(t, ctx, network, nil)
	head, err := f.ch.Head(ctx)
	require.NoError(t, err)
	require.NoError(t, f.ch.FinalizeThrough(ctx, head))

	const ahead = time.Hour
	f.scanner.clock = func() time.Time { return time.Now().Add(ahead) }
	_, err = f.scanner.CursorPass(ctx, f.n)
	require.NoError(t, err)

	// The node now answers no head, and a scheduler with a right clock
	// starts.
	noHead, err := chain.ConfirmationsPolicy(chain.ConfirmationsMax)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	n := Network{Name: network, RPC: f.client, Policy: noHead}
	s := New(Options{Store: f.db, Owner: "restarted", Registerer: reg, Networks: []Network{n}, Log: zerolog.Nop()})
	_, err = s.CursorPass(ctx, n)
	require.NoError(t, err)
	now := unixSeconds(time.Now())
	require.LessOrEqual(t, gaugeValue(t, reg, updated), now,
		"a restart exports a head read %.0f s in the future, written by a replica %s ahead", gaugeValue(t, reg, updated)-now, ahead)

	// A row an older version dated in the future is replaced by the next
	// read, not kept until the future comes.
	_, err = f.conn.Exec(ctx, `UPDATE scan_head_reads SET read_at = now() + interval '1 hour' WHERE network = $1`, network)
	require.NoError(t, err)
	s = New(Options{Store: f.db, Owner: "another", Registerer: prometheus.NewRegistry(), Networks: []Network{f.n}, Log: zerolog.Nop()})
	_, err = s.CursorPass(ctx, f.n)
	require.NoError(t, err)
	var future bool
	require.NoError(t, f.conn.QueryRow(ctx, `SELECT read_at > now() FROM scan_head_reads WHERE network = $1`, network).Scan(&future))
	require.False(t, future, "a read dated in the future stays")
}
