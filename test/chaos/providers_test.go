package chaos

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/test/harness"
)

// Provider-fault mode (chain mode): the providers lose the reports, as
// they do. Each report is dropped or duplicated, every delivery is late
// by a random delay (so reports reach the api in another order than the
// transfers), and one provider sends nothing for a long window. The
// scheduler's chain scanner must find what nobody reported: every
// transfer final on the chain is credited exactly once.
var (
	flagProviders    = flag.Bool("chaos.providers", true, "provider-fault mode (chain mode): reports dropped, duplicated, reordered, one provider paused; the scanner must find the rest")
	flagForkRescan   = flag.Bool("chaos.forkrescan", true, "provider-fault mode: after a fork deeper than the confirmations, ask POST /admin/rescan for the blocks it rewrote (false: the scanner alone)")
	flagScanInterval = flag.String("chaos.scaninterval", "1s", "the scheduler's SCAN_INTERVAL in provider-fault mode (off: no scanner, which the verifier must catch)")
)

// Provider-fault bounds.
const (
	providerDropPct = 30
	providerDupPct  = 20
	// providerShuffleMax delays each copy of a report, on top of the
	// chain load's own reportDelayMax, so that deliveries overtake each
	// other by several blocks.
	providerShuffleMax = 12 * time.Second
	// The pause: providerPauseShare of the soak's duration, starting at
	// providerPauseStart of it (a 60 s soak pauses 30 s, a 5 m soak
	// 2.5 m), at most providerPauseMax.
	providerPauseShare = 0.5
	providerPauseStart = 0.2
	providerPauseMax   = 10 * time.Minute
	// The scanner of the soak: short passes (every -chaos.scaninterval)
	// so that a backlog (a kill, an RPC fault) takes several.
	scanBlocksMax = "3"
	// scanLogWindow: smaller than a pass, so one pass asks several windows.
	scanLogWindow = "2"
	// scanCatchUpMax bounds the wait for the cursor to pass the last
	// transfer; scanCursorWaitMax the wait for the first pass.
	scanCatchUpMax    = 2 * time.Minute
	scanCursorWaitMax = time.Minute
	scanPoll          = 250 * time.Millisecond
	scanSampleEvery   = 2 * time.Second
)

// providerSources are the reporters of chain mode.
var providerSources = []string{"alchemy", "payments"}

// providerFaults decides each report's fate and keeps the tally.
type providerFaults struct {
	seed      uint64
	pausedSrc string
	pauseFrom time.Duration // from begin
	pauseFor  time.Duration

	mu      sync.Mutex
	began   time.Time
	sent    map[*report]int // deliveries that went out
	dropped map[*report]bool
	tally   map[string]int // "<source> <fate>"
	scans   *scanWatch
	// rescans the soak asked for after forks deeper than the policy, and
	// the requests never accepted.
	rescans    []string
	unaccepted []string
}

func newProviderFaults(seed uint64, duration time.Duration) *providerFaults {
	rng := rand.New(rand.NewPCG(seed, 0x9a05e))
	pause := min(time.Duration(float64(duration)*providerPauseShare), providerPauseMax)
	return &providerFaults{
		seed:      seed,
		pausedSrc: providerSources[rng.IntN(len(providerSources))],
		pauseFrom: time.Duration(float64(duration) * providerPauseStart),
		pauseFor:  pause,
		began:     time.Now(),
		sent:      map[*report]int{},
		dropped:   map[*report]bool{},
		tally:     map[string]int{},
	}
}

// providerSettings run the scanner in the scheduler, often and in short
// passes. An odd seed reads token transfers the way a network with many
// registered addresses does (by contract in windows of scanLogWindow
// blocks, each window's recipients matched by one query), an even seed
// by recipient: the soak's few addresses would otherwise only ever take
// the second path.
func providerSettings(m map[string]string, seed uint64) string {
	m["SCAN_INTERVAL"] = *flagScanInterval
	m["SCAN_BLOCKS_MAX"] = scanBlocksMax
	if seed%2 != 0 {
		m["SCAN_ADDRESSES_PER_CALL"] = "1"
		m["SCAN_LOG_WINDOW"] = scanLogWindow
		return "scanner reads tokens by contract, in windows of " + scanLogWindow + " blocks (odd seed)"
	}
	return "scanner reads tokens by recipient (even seed)"
}

func (f *providerFaults) String() string {
	return fmt.Sprintf("providers: %d%% of reports dropped, %d%% duplicated, each copy delayed up to %s; %s paused from +%s for %s",
		providerDropPct, providerDupPct, providerShuffleMax, f.pausedSrc, f.pauseFrom, f.pauseFor)
}

// begin starts the pause's clock with the load.
func (f *providerFaults) begin() {
	f.mu.Lock()
	f.began = time.Now()
	f.mu.Unlock()
}

// shape draws the report's fate before any goroutine sees it. An Alchemy
// report's conflicting version would hold the transfer's own event id
// (the scanner's too) with false content, and no one could credit the
// transfer under that id again: a lying provider, not a lossy one, so
// this mode has none.
func (f *providerFaults) shape(rep *report) {
	if rep.source == "alchemy" {
		rep.conflictBody = nil
	}
}

// deliver is a report's life under the faults: dropped, or sent once or
// twice, each copy after its own delay.
func (f *providerFaults) deliver(ctx context.Context, l *chainLoad, seed uint64, rep *report) {
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	if rng.IntN(100) < providerDropPct {
		f.count(rep.source + " dropped")
		f.mu.Lock()
		f.dropped[rep] = true
		f.mu.Unlock()
		return
	}
	copies := 1
	if rng.IntN(100) < providerDupPct {
		copies = 2
		f.count(rep.source + " duplicated")
	}
	var wg sync.WaitGroup
	for range copies {
		delay, next := time.Duration(rng.Int64N(int64(providerShuffleMax))), rng.Uint64()
		wg.Go(func() {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			l.deliverReport(ctx, next, rep)
		})
	}
	wg.Wait()
}

// silenced says whether the report's provider is paused now; if not,
// the delivery is counted as sent.
func (f *providerFaults) silenced(rep *report) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	at := time.Since(f.began)
	if rep.source == f.pausedSrc && at >= f.pauseFrom && at < f.pauseFrom+f.pauseFor {
		f.tally[rep.source+" silenced by the pause"]++
		return true
	}
	f.sent[rep]++
	return false
}

func (f *providerFaults) count(key string) {
	f.mu.Lock()
	f.tally[key]++
	f.mu.Unlock()
}

func (f *providerFaults) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	b.WriteString("provider faults:")
	for _, k := range sortedKeys(f.tally) {
		fmt.Fprintf(&b, " [%s]=%d", k, f.tally[k])
	}
	return b.String()
}

// unreported says whether no delivery of any report of the group went
// out: only the scanner can have found it.
func (f *providerFaults) unreported(group []*transfer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range group {
		for _, rep := range t.reports {
			if f.sent[rep] > 0 {
				return false
			}
		}
	}
	return true
}

// fate describes what became of a group's reports, for a finding.
func (f *providerFaults) fate(group []*transfer) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for _, t := range group {
		for _, rep := range t.reports {
			switch {
			case f.dropped[rep]:
				parts = append(parts, rep.source+" dropped")
			case f.sent[rep] == 0:
				parts = append(parts, rep.source+" silenced")
			default:
				parts = append(parts, fmt.Sprintf("%s sent %d times (held: %v)", rep.source, f.sent[rep], rep.originalHeld))
			}
		}
	}
	return "reports: " + strings.Join(parts, ", ")
}

// beyondPolicy says whether a fork dropped the block the group was first
// mined in while that block may have been final already under the soak's
// confirmations:N (the fork deeper than N): the scanner may have scanned
// it, and only the rescan the soak asks for finds the transaction mined
// again below the cursor.
func beyondPolicy(forks []devchain.Reorg, group []*transfer) bool {
	for _, r := range forks {
		if r.OldHead-r.ForkedAt <= chainConfirmations {
			continue
		}
		for _, t := range group {
			if t.block > r.ForkedAt && t.block <= r.OldHead {
				return true
			}
		}
	}
	return false
}

// rescanFork asks for a rescan of the blocks a fork deeper than the
// finality policy rewrote, as an operator would: the scanner had scanned
// some of them already (its cursor follows head − N), and the
// transactions the fork mined again there are below its cursor. A
// shallower fork rewrote only blocks the cursor has not reached.
func (f *providerFaults) rescanFork(ctx context.Context, apiURL string, r devchain.Reorg) {
	if r.OldHead-r.ForkedAt <= chainConfirmations || !*flagForkRescan {
		return
	}
	client := harness.NewClient(apiURL)
	body := map[string]any{"network": chainNetwork, "from_block": r.ForkedAt + 1, "to_block": r.NewHead}
	deadline := time.Now().Add(deliveryMax)
	for {
		status, answer, err := client.Admin(http.MethodPost, "/admin/rescan", body)
		if err == nil && status == http.StatusAccepted {
			f.mu.Lock()
			f.rescans = append(f.rescans, fmt.Sprintf("%v (blocks %d..%d)", answer["id"], r.ForkedAt+1, r.NewHead))
			f.mu.Unlock()
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil || (err == nil && status < 500) {
			f.mu.Lock()
			f.unaccepted = append(f.unaccepted, fmt.Sprintf("blocks %d..%d: %d %v %v", r.ForkedAt+1, r.NewHead, status, answer, err))
			f.mu.Unlock()
			return
		}
		select {
		case <-time.After(backoffMax):
		case <-ctx.Done():
		}
	}
}

// waitScanCursor waits for the scheduler's first pass to set the cursor
// (at the finality head then): transfers before it are history the
// scanner does not scan.
func waitScanCursor(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if *flagScanInterval == "off" {
		t.Log("SCAN_INTERVAL=off: no scanner; what no provider reported stays lost")
		return
	}
	deadline := time.Now().Add(scanCursorWaitMax)
	for {
		var next int64
		err := pool.QueryRow(context.Background(), `SELECT next_block FROM chain_cursors WHERE network = $1`, chainNetwork).Scan(&next)
		if err == nil {
			t.Logf("scan cursor of %s at block %d", chainNetwork, next)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduler's scanner set no cursor for %s within %s (last: %v)", chainNetwork, scanCursorWaitMax, err)
		}
		time.Sleep(scanPoll)
	}
}

// waitScanned waits, bounded, until the scan cursor is past the node's
// head at the end of the load (the chain keeps sealing blocks, so the
// finality head passes it).
func waitScanned(ctx context.Context, t *testing.T, c *cluster, rig *chainRig, pool *pgxpool.Pool) {
	if *flagScanInterval == "off" {
		return
	}
	head, err := rig.chain.Head(ctx)
	if err != nil {
		t.Errorf("head: %v", err)
		return
	}
	deadline := time.Now().Add(scanCatchUpMax)
	var next int64
	var running int
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.QueryRow(qctx, `SELECT next_block FROM chain_cursors WHERE network = $1`, chainNetwork).Scan(&next)
		if err == nil {
			err = pool.QueryRow(qctx, `SELECT count(*) FROM rescan_jobs WHERE status = 'running'`).Scan(&running)
		}
		cancel()
		if err == nil && uint64(next) > head && running == 0 {
			c.timeline.add("scan cursor at %d, past the load's last block %d; no rescan running", next, head)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the scan cursor did not pass block %d within %s, or rescans still run: at %d, %d rescans running (err %v)", head, scanCatchUpMax, next, running, err)
			return
		}
		time.Sleep(scanPoll)
	}
}

// scanWatch adds up the scheduler's settle_scan_deposits_total{source}
// over its lives: a counter that drops started again with a new process,
// and what the old one had counted since the last sample is not seen
// (hence "at least").
type scanWatch struct {
	mu    sync.Mutex
	done  map[string]float64 // earlier lives
	last  map[string]float64 // this life's last sample
	reads int
}

func watchScan(ctx context.Context, c *cluster) *scanWatch {
	w := &scanWatch{done: map[string]float64{}, last: map[string]float64{}}
	go func() {
		ticker := time.NewTicker(scanSampleEvery)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			w.sampleOnce(c)
		}
	}()
	return w
}

func (w *scanWatch) sampleOnce(c *cluster) {
	for _, m := range c.members {
		if m.name != "scheduler" || !m.proc.Running() {
			continue
		}
		if got, ok := scanDeposits(m.proc.URL()); ok {
			w.record(got)
		}
	}
}

func (w *scanWatch) record(got map[string]float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reads++
	restarted := false
	for k, v := range got {
		restarted = restarted || v < w.last[k]
	}
	if restarted {
		for k, v := range w.last {
			w.done[k] += v
		}
		w.last = map[string]float64{}
	}
	for k, v := range got {
		w.last[k] = v
	}
}

func (w *scanWatch) totals() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.done {
		out[k] += int(v)
	}
	for k, v := range w.last {
		out[k] += int(v)
	}
	return out
}

func scanDeposits(base string) (map[string]float64, bool) {
	resp, err := readyClient.Get(base + "/metrics")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, metricsBytesMax))
	if err != nil {
		return nil, false
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "settle_scan_deposits_total{")
		if !ok || !strings.Contains(rest, `network="`+chainNetwork+`"`) {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		_, src, ok := strings.Cut(labels, `source="`)
		if !ok {
			continue
		}
		src, _, _ = strings.Cut(src, `"`)
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			out[src] = f
		}
	}
	return out, true
}

// verifyProviders reports what the providers lost and the scanner found.
func verifyProviders(ctx context.Context, v *verdict, pool *pgxpool.Pool, l *chainLoad, scans *scanWatch, scannerOnly, scannerOnlyCredited, belowCursor int) {
	v.note("chain: %s", l.faults)
	v.note("chain: %s", l.faults.summary())
	v.note("chain: %d transfers no provider reported at all, %d of them credited (found by the scanner only); %d transfers in blocks a fork deeper than the finality policy rewrote",
		scannerOnly, scannerOnlyCredited, belowCursor)
	l.faults.mu.Lock()
	rescans, unaccepted := slices.Clone(l.faults.rescans), slices.Clone(l.faults.unaccepted)
	l.faults.mu.Unlock()
	v.note("chain: rescans asked for after forks deeper than the policy: %v", rescans)
	for _, u := range unaccepted {
		v.fail("chain: rescan not accepted", "%s", u)
	}
	rows, err := pool.Query(ctx, `SELECT id || ' ' || status || ' ' || COALESCE(error, '') FROM rescan_jobs WHERE status <> 'done'`)
	if err != nil {
		v.fail("books unreadable", "rescan_jobs: %v", err)
	} else {
		for rows.Next() {
			var s string
			if rows.Scan(&s) == nil {
				v.fail("chain: rescan not done", "%s", s)
			}
		}
		rows.Close()
	}
	if scans != nil {
		got := scans.totals()
		v.note("chain: scheduler's settle_scan_deposits_total{network=%q} over its lives (at least): %v (%d samples)", chainNetwork, got, scans.reads)
		if scannerOnly > 0 && scans.reads > 0 && got["scanner"] == 0 {
			v.fail("chain: scanner metric", "%d transfers only the scanner can have found, and settle_scan_deposits_total{source=\"scanner\"} never counted one", scannerOnly)
		}
	}
}

// TestScanWatchAddsLives: a scheduler restart starts its counters at 0;
// the watch keeps what the earlier life had counted.
func TestScanWatchAddsLives(t *testing.T) {
	w := &scanWatch{done: map[string]float64{}, last: map[string]float64{}}
	w.record(map[string]float64{"scanner": 3, "reported": 1})
	w.record(map[string]float64{"scanner": 5, "reported": 1})
	w.record(map[string]float64{"scanner": 1}) // restarted
	w.record(map[string]float64{"scanner": 2, "reported": 4})
	got := w.totals()
	if got["scanner"] != 7 || got["reported"] != 5 {
		t.Fatalf("totals %v, want scanner 7 reported 5", got)
	}
}

// TestBeyondPolicy: only a fork deeper than chainConfirmations, and
// only the blocks it dropped.
func TestBeyondPolicy(t *testing.T) {
	forks := []devchain.Reorg{{ForkedAt: 10, OldHead: 11 + chainConfirmations}, {ForkedAt: 50, OldHead: 50 + chainConfirmations}}
	for _, c := range []struct {
		block uint64
		want  bool
	}{{10, false}, {11, true}, {11 + chainConfirmations, true}, {12 + chainConfirmations, false}, {51, false}} {
		if got := beyondPolicy(forks, []*transfer{{block: c.block}}); got != c.want {
			t.Errorf("block %d: %v, want %v", c.block, got, c.want)
		}
	}
}

// TestScanDepositsParses reads the counter of the soak's network only.
func TestScanDepositsParses(t *testing.T) {
	page := "# HELP settle_scan_deposits_total x\n" +
		`settle_scan_deposits_total{network="ETH_MAINNET",source="scanner"} 12` + "\n" +
		`settle_scan_deposits_total{network="BASE_MAINNET",source="scanner"} 99` + "\n" +
		`settle_scan_deposits_total{network="ETH_MAINNET",source="reported"} 3` + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, page) }))
	defer srv.Close()
	got, ok := scanDeposits(srv.URL)
	if !ok || got["scanner"] != 12 || got["reported"] != 3 || len(got) != 2 {
		t.Fatalf("got %v %v", got, ok)
	}
}
