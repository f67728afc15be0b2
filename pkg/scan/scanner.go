// Package scan finds deposits on chain that no webhook reported: per
// network, a cursor follows the finality head in bounded passes, and
// rescans and backfills re-read ranges on request. Each transfer found
// becomes the deposit event the webhooks make for it (same id, same
// content), so a webhook and the scanner store one event between them.
//
// # Claims: a lease, not a transaction across the RPC
//
// A pass claims its range by lease (chain_cursors.lease_owner and
// lease_until, one short UPDATE), reads the chain with no transaction
// open, then stores its events and moves the cursor in one transaction
// guarded by the block the pass started at and by its lease. A
// transaction held across the RPC reads would pin a connection and a row
// lock for up to the pass timeout, run into idle_in_transaction limits
// and PgBouncer's transaction pooling, and it is what the house rule
// forbids. With the lease:
//   - two replicas never scan one range at once: the second finds the
//     lease taken and skips the pass;
//   - kill -9 at any point loses nothing: the cursor moves only in the
//     COMMIT that stores the range's events; until the lease runs out
//     (SCAN_PASS_TIMEOUT and a quarter) nobody scans, then another pass
//     reads the same range;
//   - nothing is doubled: a pass whose lease ran out and was taken over
//     finds its guarded UPDATE matching no row and stores nothing, and
//     every event id is the transfer's own, so a range read twice stores
//     each deposit once.
package scan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/tracing"
)

// Defaults and bounds of the settings.
const (
	BlocksMaxDefault        = 500
	BlocksMaxLimit          = 10_000
	IntervalDefault         = 15 * time.Second
	AddressesPerCallDefault = 1000
	PassTimeoutDefault      = time.Minute
	// LogWindowDefault: blocks of one contracts-only eth_getLogs
	// (SCAN_LOG_WINDOW). Its answer holds every transfer of the listed
	// tokens: 100 mainnet blocks of USDT and USDC is a few thousand logs,
	// under the providers' 10,000-log caps; Alchemy serves any range up
	// to 2,000 blocks.
	LogWindowDefault = 100
	LogWindowLimit   = 10_000
	// LogsMaxDefault caps one contracts-only answer (SCAN_LOGS_MAX), as
	// Infura and Alchemy cap theirs: a larger one is asked again over
	// half the blocks, so what a pass holds stays bounded.
	LogsMaxDefault = 10_000
	LogsMaxLimit   = 100_000
	// BatchesInFlightDefault: block batches one pass has asked at once
	// (SCAN_BATCHES_IN_FLIGHT), beside its token logs. The node answers a
	// batch's calls in turn; two keep it and the scanner both busy.
	BatchesInFlightDefault = 2
	BatchesInFlightLimit   = 8
	// ReorgRescanDefault: blocks below the cursor a pass asks to rescan
	// when it finds the block below its range replaced (SCAN_REORG_RESCAN;
	// confirmations:N and none only): forks deeper than the policy are
	// rare, and their depth is seldom more than a few dozen blocks.
	ReorgRescanDefault = 128
	ReorgRescanLimit   = 10_000
	// leaseMarginDivisor: a lease outlasts the pass's timeout by a quarter
	// of it, so the COMMIT after the reads still belongs to the lease.
	leaseMarginDivisor = 4
	// catchUpPassesMax bounds the passes one interval runs back to back
	// while the cursor is behind.
	catchUpPassesMax = 20
	// rescanPassesMax bounds one network's rescan passes in one interval,
	// so its cursor is never starved by a large rescan. Each network has
	// its own: one whose node is down or whose jobs wait for the chain
	// holds no other network's jobs back.
	rescanPassesMax = 4
	// addressesMax bounds the registered addresses of one network loaded
	// for a pass (100,000 is the sized target; 10x leaves room).
	addressesMax = 1_000_000
)

// Store is what the scanner needs from PostgreSQL; *postgres.DB
// implements it.
type Store interface {
	InitScanCursor(ctx context.Context, network string, start uint64) error
	ScanCursor(ctx context.Context, network string) (uint64, time.Time, bool, error)
	ClaimScanCursor(ctx context.Context, network, owner string, lease time.Duration, blocksMax, head uint64) (postgres.ScanClaim, bool, error)
	CompleteScanPass(ctx context.Context, network, owner string, claim postgres.ScanClaim, events []postgres.NewEvent) ([]postgres.StoredDeposit, error)
	ReleaseScanCursor(ctx context.Context, network, owner string) error
	SeedScanHead(ctx context.Context, network string) (time.Time, error)
	RecordScanHead(ctx context.Context, network string, every time.Duration) error
	RehashScanCursor(ctx context.Context, network, owner string, claim postgres.ScanClaim, hash string) error
	CreateRescan(ctx context.Context, id, network string, from, to uint64, operator string) (postgres.RescanJob, error)
	ScanAddresses(ctx context.Context, network, after string, limit int) ([]postgres.DepositAddress, error)
	ScanAddressOwner(ctx context.Context, network, address string) (int64, bool, error)
	DepositAddressOwners(ctx context.Context, network string, addresses []string) (map[string]int64, error)
	ResolveBackfills(ctx context.Context, networks []string) error
	RescanNetworks(ctx context.Context, networks []string) ([]string, error)
	MarkRescansWaiting(ctx context.Context, network string, head uint64) (int, error)
	ClaimRescan(ctx context.Context, network string, head uint64, owner string, lease time.Duration) (postgres.RescanClaim, bool, error)
	CompleteRescanPass(ctx context.Context, id, owner string, from, to uint64, toHash string, depth int64, events []postgres.NewEvent) ([]postgres.StoredDeposit, error)
	RestartRescan(ctx context.Context, id, owner string, next uint64, depth int64, reason string) (uint64, error)
	ReleaseRescan(ctx context.Context, id, owner string) error
	FailRescan(ctx context.Context, id, owner, reason string) error
	Assets(ctx context.Context) (*payment.Registry, error)
}

// Network is one network the scanner follows.
type Network struct {
	Name   string
	RPC    RPC
	Policy chain.Policy
}

// Options configure New. Zero values take the defaults.
type Options struct {
	Store    Store
	Networks []Network
	// Owner names this process in leases.
	Owner            string
	BlocksMax        uint64
	Interval         time.Duration
	AddressesPerCall int
	// LogWindow: blocks of one contracts-only eth_getLogs, used when more
	// than AddressesPerCall addresses are registered (fewer: one
	// recipient-filtered call per pass answers only deposits, cheaper).
	LogWindow uint64
	// FilteredLogs: always ask by recipient (SCAN_LOG_WINDOW=off).
	FilteredLogs bool
	LogsMax      int
	// BatchesInFlight: block batches a pass reads at once (1: in turn).
	BatchesInFlight int
	PassTimeout     time.Duration
	Log             zerolog.Logger
	Registerer      prometheus.Registerer
	// Traces: also find internal transfers (SCAN_TRACES=on); see traces.go.
	Traces bool
	// ReorgRescan: blocks below the cursor rescanned when a reorg
	// replaced what the cursor passed (negative: never; see link), and
	// blocks a rescan job goes back when the branch changed under it
	// between its passes (negative: to its start).
	ReorgRescan int64
}

// Scanner runs the passes of its networks.
type Scanner struct {
	opts     Options
	metrics  *metrics
	networks map[string]Network
	names    []string
	// passBlocks is each network's current pass size: halved after a pass
	// ran out of time, doubled back towards BlocksMax after one that did
	// not, so a slow node still moves the cursor. The map is read-only
	// after New; each network's goroutine updates its own value.
	passBlocks map[string]*atomic.Uint64
	// windows are each network's eth_getLogs windows (read-only map).
	windows map[string]logWindows
	// heads are each network's head-read bookkeeping (read-only map).
	heads map[string]*headState
	// started is when New ran: the time of the lag while the database
	// cannot say when the head was last read.
	started time.Time
	// clock is this replica's clock; time.Now when nil (tests set it).
	clock func() time.Time
}

// headState tracks what settle_scan_lag_updated_timestamp_seconds of one
// network holds and when this process last recorded a head read.
type headState struct {
	mu sync.Mutex
	// known: the gauge holds a head read's time (the database's or a
	// pass's); fellBack: it holds started, the database unreachable.
	known, fellBack bool
	recorded        time.Time
}

// New builds a scanner.
func New(opts Options) *Scanner {
	if opts.BlocksMax == 0 {
		opts.BlocksMax = BlocksMaxDefault
	}
	if opts.Interval <= 0 {
		opts.Interval = IntervalDefault
	}
	if opts.AddressesPerCall <= 0 {
		opts.AddressesPerCall = AddressesPerCallDefault
	}
	if opts.PassTimeout <= 0 {
		opts.PassTimeout = PassTimeoutDefault
	}
	if opts.LogWindow == 0 {
		opts.LogWindow = LogWindowDefault
	}
	if opts.LogsMax <= 0 {
		opts.LogsMax = LogsMaxDefault
	}
	if opts.BatchesInFlight <= 0 {
		opts.BatchesInFlight = BatchesInFlightDefault
	}
	if opts.ReorgRescan == 0 {
		opts.ReorgRescan = ReorgRescanDefault
	}
	s := &Scanner{opts: opts, metrics: newMetrics(opts.Registerer), networks: map[string]Network{}, passBlocks: map[string]*atomic.Uint64{},
		windows: map[string]logWindows{}, heads: map[string]*headState{}, started: time.Now()}
	for _, n := range opts.Networks {
		s.networks[n.Name] = n
		s.windows[n.Name] = logWindows{filtered: newWindow(opts.BlocksMax), contracts: newWindow(opts.LogWindow)}
		s.passBlocks[n.Name] = new(atomic.Uint64)
		s.passBlocks[n.Name].Store(opts.BlocksMax)
		s.names = append(s.names, n.Name)
		s.metrics.interval.WithLabelValues(n.Name).Set(opts.Interval.Seconds())
		s.metrics.passTimeout.WithLabelValues(n.Name).Set(opts.PassTimeout.Seconds())
		// The time of the lag is not set here: the first pass seeds it
		// from the database (seedHead), and a fresh start time exported
		// meanwhile would win the replicas' max and reset the alert.
		s.heads[n.Name] = &headState{}
	}
	sort.Strings(s.names)
	return s
}

// Run scans every interval until ctx ends. Each network runs on its own
// goroutine and ticker: a network whose node is slow (each pass near
// SCAN_PASS_TIMEOUT, catching up) delays no other network's passes. Run
// returns once every network's goroutine has.
func (s *Scanner) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, name := range s.names {
		n := s.networks[name]
		wg.Go(func() {
			ticker := time.NewTicker(s.opts.Interval)
			defer ticker.Stop()
			for {
				s.tickNetwork(ctx, n)
				select {
				case <-ctx.Done():
					return
				case <-ticker.C:
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
}

// Tick runs one interval's work of every network, the networks at once,
// and returns when all are done.
func (s *Scanner) Tick(ctx context.Context) {
	var wg sync.WaitGroup
	for _, name := range s.names {
		n := s.networks[name]
		wg.Go(func() { s.tickNetwork(ctx, n) })
	}
	wg.Wait()
}

// tickNetwork runs one interval's work of network n: its cursor passes
// (back to back while behind, up to catchUpPassesMax), then its rescan
// passes (up to rescanPassesMax).
func (s *Scanner) tickNetwork(ctx context.Context, n Network) {
	for range catchUpPassesMax {
		more, err := s.CursorPass(ctx, n)
		if err != nil && ctx.Err() == nil {
			s.opts.Log.Warn().Err(err).Str("network", n.Name).Msg("scan pass failed; the next interval tries again")
		}
		if err != nil || !more {
			break
		}
	}
	// The statements between the passes are bounded as a pass is: Run's
	// context has no deadline, and a PostgreSQL that stops answering
	// mid-call without a reset held the network's scan until the kernel
	// gave the socket up. They are asked per network, so no network waits
	// for another's passes to end before its jobs are read.
	networks := []string{n.Name}
	stmtCtx, cancel := context.WithTimeout(ctx, s.opts.PassTimeout)
	err := s.opts.Store.ResolveBackfills(stmtCtx, networks)
	cancel()
	if err != nil && ctx.Err() == nil {
		s.opts.Log.Warn().Err(err).Str("network", n.Name).Msg("backfill ends not resolved; the next interval tries again")
	}
	stmtCtx, cancel = context.WithTimeout(ctx, s.opts.PassTimeout)
	withJobs, err := s.opts.Store.RescanNetworks(stmtCtx, networks)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.opts.Log.Warn().Err(err).Str("network", n.Name).Msg("rescan jobs not read; the next interval tries again")
		}
		return
	}
	if !slices.Contains(withJobs, n.Name) {
		s.metrics.rescansWaiting.WithLabelValues(n.Name).Set(0)
		return
	}
	for range rescanPassesMax {
		did, err := s.RescanPass(ctx, n)
		if err != nil && ctx.Err() == nil {
			s.opts.Log.Warn().Err(err).Str("network", n.Name).Msg("rescan pass failed; the next interval tries again")
		}
		if err != nil || !did {
			break
		}
	}
}

func (s *Scanner) lease() time.Duration {
	return s.opts.PassTimeout + s.opts.PassTimeout/leaseMarginDivisor
}

// CursorPass runs one pass of the network's cursor (n is one given to
// New); more reports that the cursor is still behind the finality head.
func (s *Scanner) CursorPass(ctx context.Context, n Network) (more bool, err error) {
	result := resultError
	defer func() { s.metrics.passes.WithLabelValues(n.Name, kindCursor, result).Inc() }()
	ctx, cancel := context.WithTimeout(ctx, s.opts.PassTimeout)
	defer cancel()
	s.seedHead(ctx, n.Name)
	head, ok, err := n.RPC.FinalityHead(ctx, n.Policy)
	s.count(n.Name, chain.MethodBlock, 1)
	if err != nil {
		return false, err
	}
	if !ok {
		result = resultIdle
		s.succeeded(n.Name)
		return false, nil
	}
	next, _, found, err := s.opts.Store.ScanCursor(ctx, n.Name)
	if err != nil {
		return false, err
	}
	if !found {
		// The first run starts at the current finality head, that block
		// included (the contract): history before it nobody asked for is
		// never scanned (a backfill or rescan asks). The next pass reads it.
		if err := s.opts.Store.InitScanCursor(ctx, n.Name, head); err != nil {
			return false, err
		}
		s.opts.Log.Info().Str("network", n.Name).Uint64("next_block", head).Msg("scan cursor starts at the finality head")
		result = resultIdle
		s.succeeded(n.Name)
		s.setLag(ctx, n.Name, lag(head, head), true)
		return false, nil
	}
	s.setLag(ctx, n.Name, lag(next, head), true)
	if next > head {
		result = resultIdle
		s.succeeded(n.Name)
		return false, nil
	}
	defer func() {
		// The pass's own deadline, not the caller's cancellation.
		timedOut := err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
		blocks := s.passBlocks[n.Name]
		blocks.Store(nextPassBlocks(blocks.Load(), s.opts.BlocksMax, timedOut))
	}()
	claim, ok, err := s.opts.Store.ClaimScanCursor(ctx, n.Name, s.opts.Owner, s.lease(), max(s.passBlocks[n.Name].Load(), 1), head)
	if err != nil {
		return false, err
	}
	if !ok {
		result = resultSkipped
		return false, nil
	}
	ctx, traceID, pass := startPass(ctx)
	defer func() { tracing.End(pass, err) }()
	linked := s.links(n)
	events, blocks, err := s.read(ctx, n, span{claim.From, claim.To}, "", traceID, linked)
	if err == nil && linked {
		err = s.link(ctx, n, &claim, blocks)
	}
	if err != nil {
		s.release(n.Name, func(ctx context.Context) error { return s.opts.Store.ReleaseScanCursor(ctx, n.Name, s.opts.Owner) })
		return false, err
	}
	stored, err := s.opts.Store.CompleteScanPass(ctx, n.Name, s.opts.Owner, claim, events)
	if errors.Is(err, postgres.ErrLeaseLost) {
		result = resultLeaseLost
		return false, nil
	}
	if err != nil {
		s.release(n.Name, func(ctx context.Context) error { return s.opts.Store.ReleaseScanCursor(ctx, n.Name, s.opts.Owner) })
		return false, err
	}
	result = resultOK
	s.succeeded(n.Name)
	s.metrics.blocks.WithLabelValues(n.Name, kindCursor).Add(float64(claim.To - claim.From + 1))
	// The head was read and recorded at the pass's start: one write a pass.
	s.setLag(ctx, n.Name, lag(claim.To+1, head), false)
	s.record(n.Name, events, stored)
	s.opts.Log.Debug().Str(logging.FieldTraceID, traceID).Str("network", n.Name).Uint64("from", claim.From).Uint64("to", claim.To).
		Int("deposits", len(events)).Msg("scan pass")
	return claim.To < head, nil
}

// links tells whether n's cursor passes link their blocks (see link):
// under confirmations:N and none a fork deeper than the policy can
// replace blocks the cursor passed, or is about to pass; under finalized
// nothing can.
func (s *Scanner) links(n Network) bool {
	return linksBlocks(n.Policy)
}

func linksBlocks(p chain.Policy) bool { return p.Kind() != chain.Finalized }

// chained checks that blocks are r's, in order, each the parent of the
// next: what one branch holds.
func chained(n Network, r span, blocks []chain.Block) error {
	for i, b := range blocks {
		if b.Number != r.from+uint64(i) {
			return fmt.Errorf("scan %s: block %d read where block %d was due", n.Name, b.Number, r.from+uint64(i))
		}
		if b.ParentHash == "" {
			return fmt.Errorf("scan %s: block %d read without its parentHash, which the pass needs to link its blocks", n.Name, b.Number)
		}
		if i > 0 && b.ParentHash != blocks[i-1].Hash {
			return payment.Unavailable("scan "+n.Name, fmt.Errorf(
				"block %d (parent %s) does not follow block %d (%s) as read: backends on different branches; the pass runs again",
				b.Number, b.ParentHash, blocks[i-1].Number, blocks[i-1].Hash))
		}
	}
	if uint64(len(blocks)) != r.to-r.from+1 {
		return fmt.Errorf("scan %s: %d blocks read of %d..%d", n.Name, len(blocks), r.from, r.to)
	}
	return nil
}

// link holds the blocks a cursor pass read (From through To, in order)
// to one chain: each block's parent is the block read below it, and the
// first one's is the block the pass before recorded as its last. Behind
// a balancer the pass's reads can come from backends on different
// branches; a hash read apart from the blocks (a header of To) could
// then name a branch the range was not read from, and the next pass
// would find nothing replaced while a transaction the fork mined inside
// the range was never read. Linked, what the pass read is one branch, and
// the hash it records is its own last block's. A break inside the range
// fails the pass (it runs again). A break at its start means the block
// below was replaced (or read from another branch): unless ReorgRescan is
// off, a rescan of up to ReorgRescan blocks below the range is asked for
// (rescans store what they find once, by transfer identity) and the new
// parent recorded, so it is asked once. No call of its own: each block
// read names its parent.
func (s *Scanner) link(ctx context.Context, n Network, claim *postgres.ScanClaim, blocks []chain.Block) error {
	if err := chained(n, span{claim.From, claim.To}, blocks); err != nil {
		return err
	}
	if below := blocks[0].ParentHash; s.opts.ReorgRescan >= 0 && claim.LastHash != "" && claim.From > 0 && below != claim.LastHash {
		from := uint64(0)
		if depth := uint64(s.opts.ReorgRescan); claim.From > depth {
			from = claim.From - depth
		}
		job, err := s.opts.Store.CreateRescan(ctx, "rescan_"+uuid.NewString(), n.Name, from, claim.From-1,
			fmt.Sprintf("settle: block %d replaced below the scan cursor (hash %s, was %s)", claim.From-1, below, claim.LastHash))
		if err != nil {
			return err
		}
		if err := s.opts.Store.RehashScanCursor(ctx, n.Name, s.opts.Owner, *claim, below); err != nil {
			return err
		}
		s.metrics.reorgs.WithLabelValues(n.Name).Inc()
		s.opts.Log.Warn().Str("network", n.Name).Uint64("block", claim.From-1).Str("hash", below).Str("was", claim.LastHash).
			Str("rescan", job.ID).Uint64("from", from).Msg("a reorg replaced blocks the scan cursor passed; rescanning below it")
	}
	claim.ToHash = blocks[len(blocks)-1].Hash
	return nil
}

// RescanPass runs one pass of a rescan or backfill job of network n: of
// those whose next block is final, the one whose last pass is oldest
// (jobs take turns). did is false when none could run: none is left, or
// the rest wait for the chain (counted, and shown on each job), or n's
// node fails, which holds back n's jobs only.
func (s *Scanner) RescanPass(ctx context.Context, n Network) (did bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.PassTimeout)
	defer cancel()
	head, final, err := n.RPC.FinalityHead(ctx, n.Policy)
	s.count(n.Name, chain.MethodBlock, 1)
	if err != nil || !final {
		return false, err
	}
	waiting, err := s.opts.Store.MarkRescansWaiting(ctx, n.Name, head)
	if err != nil {
		return false, err
	}
	s.metrics.rescansWaiting.WithLabelValues(n.Name).Set(float64(waiting))
	job, ok, err := s.opts.Store.ClaimRescan(ctx, n.Name, head, s.opts.Owner, s.lease())
	if err != nil || !ok {
		return false, err
	}
	result := resultError
	defer func() { s.metrics.passes.WithLabelValues(n.Name, kindRescan, result).Inc() }()
	release := func() {
		s.release(n.Name, func(ctx context.Context) error { return s.opts.Store.ReleaseRescan(ctx, job.ID, s.opts.Owner) })
	}
	r, ok := bounded(job.Next, job.To, head, s.opts.BlocksMax)
	if !ok {
		// Claimed at or below head, so a range already past its end (no
		// writer leaves one running): ended, lest it be claimed first
		// every pass.
		if err := s.opts.Store.FailRescan(ctx, job.ID, s.opts.Owner, "nothing left to scan: next block past the range's end"); err != nil {
			release()
			return false, err
		}
		return true, fmt.Errorf("rescan %s failed: next block %d is past its end %d", job.ID, job.Next, job.To)
	}
	ctx, traceID, pass := startPass(ctx)
	defer func() { tracing.End(pass, err) }()
	// Under confirmations:N and none a fork can split a rescan's range
	// between branches too: its blocks are linked, as a cursor pass's, and
	// the first to the last block the job's pass before read (nothing
	// holds the job's first pass to the blocks below its range).
	linked := s.links(n)
	events, blocks, err := s.read(ctx, n, r, job.Address, traceID, linked)
	if err == nil && linked {
		err = chained(n, r, blocks)
	}
	toHash := ""
	if err == nil && linked {
		toHash = blocks[len(blocks)-1].Hash
		if below := blocks[0].ParentHash; job.LastHash != "" && below != job.LastHash {
			// The branch changed under the job: what its passes read before
			// may be the other branch's, and a deposit the fork mined there
			// would be passed for good. The job goes back SCAN_REORG_RESCAN
			// blocks (its whole range when that is off), never before its
			// start, and this pass stores nothing; found deposits are stored
			// and counted once, so reading again doubles nothing. The job
			// records the restart, for an operator looking at it.
			reason := fmt.Sprintf("the branch changed under the job between its passes: block %d is %s, the pass before read %s",
				job.Next-1, below, job.LastHash)
			restart, err := s.opts.Store.RestartRescan(ctx, job.ID, s.opts.Owner, job.Next, s.opts.ReorgRescan, reason)
			if errors.Is(err, postgres.ErrLeaseLost) {
				result = resultLeaseLost
				return true, nil
			}
			if err != nil {
				release()
				return false, fmt.Errorf("rescan %s: %w", job.ID, err)
			}
			result = resultRestarted
			s.opts.Log.Warn().Str(logging.FieldTraceID, traceID).Str("rescan", job.ID).Str("network", n.Name).
				Uint64("block", job.Next-1).Str("hash", below).Str("was", job.LastHash).Uint64("next_block", restart).
				Msg("the branch changed under a rescan between its passes (a fork, or backends on different branches); reading its range again")
			return true, nil
		}
	}
	if errors.Is(err, payment.ErrInvalid) {
		// A range the node or settle can never read (not an outage): the
		// job ends failed, saying why, instead of retrying forever.
		if failErr := s.opts.Store.FailRescan(ctx, job.ID, s.opts.Owner, err.Error()); failErr != nil {
			release()
			return false, failErr
		}
		return true, fmt.Errorf("rescan %s failed: %w", job.ID, err)
	}
	if err != nil {
		release()
		return false, fmt.Errorf("rescan %s: %w", job.ID, err)
	}
	stored, err := s.opts.Store.CompleteRescanPass(ctx, job.ID, s.opts.Owner, r.from, r.to, toHash, s.opts.ReorgRescan, events)
	if errors.Is(err, postgres.ErrLeaseLost) {
		result = resultLeaseLost
		return true, nil
	}
	if err != nil {
		release()
		return false, fmt.Errorf("rescan %s: %w", job.ID, err)
	}
	result = resultOK
	s.metrics.blocks.WithLabelValues(n.Name, kindRescan).Add(float64(r.to - r.from + 1))
	s.record(n.Name, events, stored)
	s.opts.Log.Info().Str("rescan", job.ID).Str("network", n.Name).Uint64("from", r.from).Uint64("to", r.to).
		Int("deposits", len(events)).Msg("rescan pass")
	return true, nil
}

// startPass begins the trace of a pass that reads blocks: its id, fresh
// and W3C-shaped, is the trace_id of every deposit the pass stores and of
// its log lines; with tracing on, its "scan pass" span is their
// traceparent, so a found deposit's worker spans join the pass that found
// it. Idle passes start none.
func startPass(ctx context.Context) (context.Context, string, trace.Span) {
	traceID := tracing.NewTraceID()
	ctx, pass := tracing.Start(tracing.WithTraceID(ctx, traceID), "scan pass", tracing.Internal)
	return ctx, traceID, pass
}

// read finds the deposits of range r on n: for every registered address,
// or for one (a backfill). With blocks, it reads every block of r and
// answers them too.
func (s *Scanner) read(ctx context.Context, n Network, r span, address, traceID string, blocks bool) ([]postgres.NewEvent, []chain.Block, error) {
	registry, err := s.opts.Store.Assets(ctx)
	if err != nil {
		return nil, nil, err
	}
	addrs, err := s.addresses(ctx, n.Name, address)
	if err != nil {
		return nil, nil, err
	}
	filteredMax := s.opts.AddressesPerCall
	if s.opts.FilteredLogs {
		filteredMax = addressesMax
	}
	f := finder{
		network: n.Name, rpc: n.RPC, registry: registry, addressesPerCall: s.opts.AddressesPerCall,
		filteredMax: filteredMax, logsMax: s.opts.LogsMax, batchesInFlight: s.opts.BatchesInFlight, windows: s.windows[n.Name],
		owners: func(ctx context.Context, addresses []string) (map[string]int64, error) {
			return s.opts.Store.DepositAddressOwners(ctx, n.Name, addresses)
		},
		all:     func(ctx context.Context) (addressSet, error) { return s.allAddresses(ctx, n.Name) },
		refused: func() { s.metrics.logsRefused.WithLabelValues(n.Name).Inc() },
		traceID: traceID,
		count:   func(method string, k int) { s.count(n.Name, method, k) },
		skipped: func(id, why string) {
			s.opts.Log.Error().Str(logging.FieldEventID, id).Str("reason", why).Msg("scanned transfer cannot be credited; a human must look")
		},
		blocks: blocks,
	}
	return s.findAll(ctx, f, r, addrs)
}

// addresses is the set a pass matches: the one address of a backfill, a
// few (at most AddressesPerCall, asked for by recipient), or, above that,
// none loaded: the recipients each window finds are looked up instead,
// so a pass costs the same at 100,000 addresses as at 2,000. Traces and
// SCAN_LOG_WINDOW=off match against the complete set.
func (s *Scanner) addresses(ctx context.Context, network, only string) (addressSet, error) {
	set := addressSet{owner: map[string]int64{}, complete: true}
	if only != "" {
		user, ok, err := s.opts.Store.ScanAddressOwner(ctx, network, only)
		if err != nil || !ok {
			return set, err
		}
		set.sorted, set.owner[only] = []string{only}, user
		return set, nil
	}
	if s.opts.FilteredLogs || s.opts.Traces {
		return s.allAddresses(ctx, network)
	}
	page, err := s.opts.Store.ScanAddresses(ctx, network, "", s.opts.AddressesPerCall+1)
	if err != nil {
		return set, err
	}
	if len(page) > s.opts.AddressesPerCall {
		return addressSet{}, nil
	}
	for _, a := range page {
		set.sorted = append(set.sorted, a.Address)
		set.owner[a.Address] = a.UserID
	}
	return set, nil
}

// allAddresses loads the network's registered addresses in bounded pages.
func (s *Scanner) allAddresses(ctx context.Context, network string) (addressSet, error) {
	set := addressSet{owner: map[string]int64{}, complete: true}
	after := ""
	for len(set.sorted) < addressesMax {
		page, err := s.opts.Store.ScanAddresses(ctx, network, after, postgres.ScanAddressesPageMax)
		if err != nil {
			return set, err
		}
		for _, a := range page {
			set.sorted = append(set.sorted, a.Address)
			set.owner[a.Address] = a.UserID
		}
		if len(page) < postgres.ScanAddressesPageMax {
			return set, nil
		}
		after = page[len(page)-1].Address
	}
	return set, fmt.Errorf("network %s has more than %d deposit addresses; the scanner refuses to load them all", network, addressesMax)
}

func (s *Scanner) record(network string, events []postgres.NewEvent, stored []postgres.StoredDeposit) {
	for i, st := range stored {
		switch st.Returned {
		case postgres.WatchedAgain:
			s.opts.Log.Warn().Str(logging.FieldEventID, events[i].Event.ID).Int64(logging.FieldUserID, events[i].Event.UserID).
				Msg("scanner found the transfer of a compensated deposit canonical again; watched until final, then given back")
		case postgres.CyclesExhausted:
			s.opts.Log.Error().Str(logging.FieldEventID, events[i].Event.ID).
				Msg("scanner found a compensated deposit canonical again, but it was reorged away and back too often; it stays compensated for a human to decide")
		}
		switch {
		case st.Err != nil:
			s.metrics.deposits.WithLabelValues(network, SourceConflict).Inc()
			s.opts.Log.Error().Err(st.Err).Str(logging.FieldEventID, events[i].Event.ID).Msg("scanned transfer conflicts with the stored deposit")
		case st.Superseded:
			s.metrics.deposits.WithLabelValues(network, SourceSuperseded).Inc()
			s.opts.Log.Warn().Str(logging.FieldEventID, events[i].Event.ID).Int64(logging.FieldUserID, events[i].Event.UserID).
				Msg("scanned transfer supersedes a stored deposit the chain contradicted (failed mismatch); reopened with the chain's content")
		case st.Reopened:
			s.metrics.deposits.WithLabelValues(network, SourceReopened).Inc()
			s.opts.Log.Warn().Str(logging.FieldEventID, events[i].Event.ID).Int64(logging.FieldUserID, events[i].Event.UserID).
				Msg("scanner found the transfer of a reorged deposit canonical again; reopened")
		case st.Returned == postgres.WatchedAgain && !st.Inserted:
			s.metrics.deposits.WithLabelValues(network, SourceReopened).Inc()
		case st.Inserted:
			s.metrics.deposits.WithLabelValues(network, SourceScanner).Inc()
			s.opts.Log.Info().Str(logging.FieldEventID, events[i].Event.ID).Int64(logging.FieldUserID, events[i].Event.UserID).
				Str("asset", events[i].Event.Asset).Msg("scanner found a deposit no webhook reported")
		default:
			s.metrics.deposits.WithLabelValues(network, SourceReported).Inc()
		}
	}
}

// release gives a lease back after a failed pass, on a context of its own
// (the pass's may be what ran out).
func (s *Scanner) release(network string, do func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := do(ctx); err != nil {
		s.opts.Log.Warn().Err(err).Str("network", network).Msg("scan lease not released; it runs out on its own")
	}
}

func (s *Scanner) count(network, method string, n int) {
	s.metrics.calls.WithLabelValues(network, method).Add(float64(n))
}

// setLag sets the network's lag and when it was set. With record, it
// records the head read in the database too, unless this process did
// less than an interval ago (the statement skips it as well when another
// replica did), so a network costs about one write an interval, whatever
// the replicas. The record takes the database's clock: another replica
// reads it back, and one whose clock runs ahead must not date it.
func (s *Scanner) setLag(ctx context.Context, network string, blocks uint64, record bool) {
	now := time.Now()
	if s.clock != nil {
		now = s.clock()
	}
	s.metrics.lag.WithLabelValues(network).Set(float64(blocks))
	s.metrics.lagUpdated.WithLabelValues(network).Set(unixSeconds(now))
	h := s.heads[network]
	h.mu.Lock()
	defer h.mu.Unlock()
	h.known = true
	if !record || now.Sub(h.recorded) < s.opts.Interval {
		return
	}
	if err := s.opts.Store.RecordScanHead(ctx, network, s.opts.Interval); err != nil {
		s.opts.Log.Warn().Err(err).Str("network", network).Msg("finality head read not recorded; a restart may count from an older read")
		return
	}
	h.recorded = now
}

// seedHead sets the time of the lag, before a pass of a network whose
// head this process has not read, to when any replica last read it (the
// database's), so a restart neither clears SettleScannerHeadUnread nor
// starts its count again. A network never read counts from the first
// start of a scanner following it. While the database does not answer,
// the time is this process's start, and the next pass asks again.
func (s *Scanner) seedHead(ctx context.Context, network string) {
	h := s.heads[network]
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.known {
		return
	}
	at, err := s.opts.Store.SeedScanHead(ctx, network)
	if err != nil {
		if !h.fellBack {
			h.fellBack = true
			s.metrics.lagUpdated.WithLabelValues(network).Set(unixSeconds(s.started))
			s.opts.Log.Warn().Err(err).Str("network", network).
				Msg("when the finality head was last read is unknown (database unreachable); counting from this start until the database answers")
		}
		return
	}
	h.known = true
	s.metrics.lagUpdated.WithLabelValues(network).Set(unixSeconds(at))
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func (s *Scanner) succeeded(network string) {
	s.metrics.lastSuccess.WithLabelValues(network).SetToCurrentTime()
}
