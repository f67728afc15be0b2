package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// SourceScanner marks the deposits the chain scanner stored first.
const SourceScanner Source = "scanner"

// ScanAddressesPageMax bounds one page of deposit addresses a pass loads.
const ScanAddressesPageMax = 10_000

// ErrLeaseLost: another scheduler took the pass's range over (its lease
// ran out); the pass stored nothing and moves nothing.
var ErrLeaseLost = errors.New("scan lease lost to another scheduler")

// Requesters of a rescan job.
const (
	RescanByAdmin    = "admin"
	RescanByBackfill = "backfill"
)

// RescanOperatorMax bounds rescan_jobs.operator (its CHECK, migration 0016).
const RescanOperatorMax = 1500

// ScanClaim is a claimed cursor range, From through To.
type ScanClaim struct {
	From, To uint64
	// LastHash is the hash of block From-1 as the pass before read it;
	// "" when not known.
	LastHash string
	// ToHash is the hash of block To as this pass read it (set by the
	// scanner from the blocks it read; stored with the cursor's advance).
	ToHash string
}

// DepositAddress is a registered address and its user.
type DepositAddress struct {
	Address string
	UserID  int64
}

// StoredDeposit is what became of one event a pass stored.
type StoredDeposit struct {
	Inserted bool  // new: no webhook had reported it
	Err      error // payment.ErrConflict: the id holds other content
	// Superseded: the id held a failed/mismatch deposit, which now has
	// this content and waits for the finality gate (SupersedeDeposit).
	Superseded bool
	// Reopened: the id held this very deposit, failed/reorged; the scan
	// shows its transaction canonical again, so it went back to pending
	// (ReopenDeposit).
	Reopened bool
	// Returned: the id, or the transfer's claim, named a deposit credited
	// and then compensated for a reorg; WatchedAgain when it is watched
	// again (ReturnDeposit), CyclesExhausted when it stays compensated.
	Returned Return
}

// InitScanCursor creates the network's cursor at block start unless it
// exists.
func (db *DB) InitScanCursor(ctx context.Context, network string, start uint64) error {
	stmt := q("scan_cursor_init")
	_, err := db.pool.Exec(ctx, stmt.text, network, int64(start))
	return classify(stmt.name, err)
}

// ScanCursor reads the network's next block; found false without a cursor.
func (db *DB) ScanCursor(ctx context.Context, network string) (next uint64, updated time.Time, found bool, err error) {
	stmt := q("scan_cursor_get")
	var n int64
	err = db.pool.QueryRow(ctx, stmt.text, network).Scan(&n, &updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	if err != nil {
		return 0, time.Time{}, false, classify(stmt.name, err)
	}
	return uint64(n), updated, true, nil
}

// ClaimScanCursor leases the network's next range of at most blocksMax
// blocks ending at or before head; ok false when another scheduler holds
// the lease or the cursor is past the head.
func (db *DB) ClaimScanCursor(ctx context.Context, network, owner string, lease time.Duration, blocksMax, head uint64) (ScanClaim, bool, error) {
	stmt := q("scan_cursor_claim")
	var from, to int64
	var last string
	err := db.pool.QueryRow(ctx, stmt.text, network, owner, lease.Milliseconds(), int64(blocksMax), int64(head)).Scan(&from, &to, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return ScanClaim{}, false, nil
	}
	if err != nil {
		return ScanClaim{}, false, classify(stmt.name, err)
	}
	return ScanClaim{From: uint64(from), To: uint64(to), LastHash: last}, true, nil
}

// CompleteScanPass stores a pass's deposits and moves the cursor past
// the claim in one transaction; ErrLeaseLost (nothing stored) when the
// claim is no longer this owner's.
func (db *DB) CompleteScanPass(ctx context.Context, network, owner string, claim ScanClaim, events []NewEvent) ([]StoredDeposit, error) {
	stmt := q("scan_cursor_advance")
	return db.inPass(ctx, events, func(tx pgx.Tx) (bool, error) {
		var next int64
		err := tx.QueryRow(ctx, stmt.text, network, owner, int64(claim.From), int64(claim.To), claim.ToHash).Scan(&next)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, classify(stmt.name, err)
	})
}

// RehashScanCursor records hash as the hash of the block below the
// claimed range (the chain's now), for the pass holding the lease.
func (db *DB) RehashScanCursor(ctx context.Context, network, owner string, claim ScanClaim, hash string) error {
	stmt := q("scan_cursor_rehash")
	_, err := db.pool.Exec(ctx, stmt.text, network, owner, int64(claim.From), hash)
	return classify(stmt.name, err)
}

// ReleaseScanCursor gives a failed pass's lease back.
func (db *DB) ReleaseScanCursor(ctx context.Context, network, owner string) error {
	stmt := q("scan_cursor_release")
	_, err := db.pool.Exec(ctx, stmt.text, network, owner)
	return classify(stmt.name, err)
}

// SeedScanHead answers when the network's finality head was last read,
// by any scheduler; a network never read answers now, recorded as its
// first start. Both on the database's clock.
func (db *DB) SeedScanHead(ctx context.Context, network string) (time.Time, error) {
	stmt := q("scan_head_seed")
	var at time.Time
	err := db.pool.QueryRow(ctx, stmt.text, network).Scan(&at)
	return at, classify(stmt.name, err)
}

// RecordScanHead records that the network's head was read now (the
// database's clock, not the replica's), unless a read within every
// before it is recorded already.
func (db *DB) RecordScanHead(ctx context.Context, network string, every time.Duration) error {
	stmt := q("scan_head_read")
	_, err := db.pool.Exec(ctx, stmt.text, network, every.Milliseconds())
	return classify(stmt.name, err)
}

// inPass runs guard, then inserts the events through the outbox insert
// (pending, pg_notify at COMMIT), all in one transaction; an event stored
// before with the same content that ended failed/reorged is reopened.
// The events are stored in id order; out[i] answers events[i].
func (db *DB) inPass(ctx context.Context, events []NewEvent, guard func(pgx.Tx) (bool, error)) ([]StoredDeposit, error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return nil, classify("scan pass begin", err)
	}
	defer rollbackDetached(ctx, tx)
	ok, err := guard(tx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrLeaseLost
	}
	// Passes find transfers in block order (token logs first), cut into
	// windows and chunks their own way: a cursor pass and a rescan over
	// the same blocks, or a pass and a webhook batch, would take the same
	// rows in other orders and deadlock. Passes of one network queue on
	// its lock (scan_lock_network); the events go in id byte order, as
	// insert_events inserts them.
	networks := make([]string, 0, 1)
	order := make([]int, len(events))
	for i, e := range events {
		order[i] = i
		if !slices.Contains(networks, e.Event.Network) {
			networks = append(networks, e.Event.Network)
		}
	}
	if len(networks) > 0 {
		lock := q("scan_lock_network")
		if _, err := tx.Exec(ctx, lock.text, networks); err != nil {
			return nil, classify(lock.name, err)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(events[a].Event.ID, events[b].Event.ID) })
	out := make([]StoredDeposit, len(events))
	for _, i := range order {
		e := events[i]
		inserted, err := insertEvent(ctx, tx, e)
		switch {
		case errors.Is(err, payment.ErrConflict):
			out[i].Err = err
			result, err := supersedeInPass(ctx, tx, e)
			if err != nil {
				return nil, err
			}
			if result != SupersedeRefused {
				out[i].Err, out[i].Superseded = nil, result == SupersedeDone
			}
		case err != nil:
			return nil, err
		case inserted:
			out[i].Inserted = true
			// New under the transfer's id, the transfer may still be
			// claimed by a deposit /webhook/payments named, compensated
			// since: watched again to be given back (this event then
			// ends duplicate_transfer).
			out[i].Returned, err = returnDeposit(ctx, tx, "", e.transfer(), true, "the chain scanner found the transfer again")
			if err != nil {
				return nil, err
			}
		default:
			// Scanned means mined, successful, at or below the finality
			// head: a deposit that ended reorged, not_found (dropped, then
			// mined again after FINALITY_TIMEOUT) or reverted (reorged into
			// a block where it succeeds) is on the chain now. Reopened, it
			// is credited through the gate and its transfer claim.
			reopened, err := reopenDeposit(ctx, tx, e.Event.ID, scanReopens, "the chain scanner found the transfer again")
			if err != nil {
				return nil, err
			}
			out[i].Reopened = reopened
			if reopened {
				continue
			}
			// A credited deposit compensated for a reorg: watched again,
			// and given back once its block is finalized.
			out[i].Returned, err = returnDeposit(ctx, tx, e.Event.ID, e.transfer(), true, "the chain scanner found the transfer again")
			if err != nil {
				return nil, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, classify("scan pass commit", err)
	}
	return out, nil
}

// scanReopens are the outcomes of a stored deposit that the scanner's
// finding its transfer undoes (a mismatch is superseded instead).
var scanReopens = []payment.Outcome{payment.OutcomeReorged, payment.OutcomeNotFound, payment.OutcomeReverted}

// ScanAddresses loads a page of at most limit (≤ ScanAddressesPageMax)
// addresses of network after the address after.
func (db *DB) ScanAddresses(ctx context.Context, network, after string, limit int) ([]DepositAddress, error) {
	if limit <= 0 || limit > ScanAddressesPageMax {
		limit = ScanAddressesPageMax
	}
	stmt := q("scan_addresses_page")
	rows, err := db.pool.Query(ctx, stmt.text, network, after, limit)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var out []DepositAddress
	for rows.Next() {
		var a DepositAddress
		if err := rows.Scan(&a.Address, &a.UserID); err != nil {
			return nil, classify(stmt.name, err)
		}
		out = append(out, a)
	}
	return out, classify(stmt.name, rows.Err())
}

// ScanAddressOwner finds one address's user; found false when unregistered.
func (db *DB) ScanAddressOwner(ctx context.Context, network, address string) (int64, bool, error) {
	stmt := q("scan_address_owner")
	var user int64
	err := db.pool.QueryRow(ctx, stmt.text, network, address).Scan(&user)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, classify(stmt.name, err)
	}
	return user, true, nil
}

// RescanJob is a rescan_jobs row (the console lists them too).
type RescanJob struct {
	ID          string
	Network     string
	Address     string // empty: every address of the network
	FromBlock   uint64
	ToBlock     *uint64 // nil: a backfill whose end is not resolved yet
	NextBlock   uint64
	Status      string
	Error       string
	Found       int    // transfers its passes found, each counted once
	RequestedBy string // the kind: RescanByAdmin or RescanByBackfill
	// Operator is who asked and why ("name @ip", the console's "name
	// (console, role) @ip: reason"); empty for backfills and older rows.
	Operator  string
	CreatedAt time.Time
	UpdatedAt time.Time
	// WaitingHead is set while a running job waits for the chain: the
	// network's finality head as the scanner last read it was below
	// NextBlock.
	WaitingHead *uint64
	// Restarts counts the times the branch changed under the job between
	// its passes and it went back (RestartRescan); LastRestartAt and
	// LastRestartReason tell the latest (nil and "" before any).
	Restarts          int
	LastRestartAt     *time.Time
	LastRestartReason string
}

// CreateRescan records a rescan of network's blocks from through to for
// every registered address, asked for by operator (who, and why).
func (db *DB) CreateRescan(ctx context.Context, id, network string, from, to uint64, operator string) (RescanJob, error) {
	if operator == "" || utf8.RuneCountInString(operator) > RescanOperatorMax {
		return RescanJob{}, payment.Invalid("a rescan names who asked for it, in at most %d characters", RescanOperatorMax)
	}
	stmt := q("rescan_insert")
	var created time.Time
	if err := db.pool.QueryRow(ctx, stmt.text, id, network, nil, int64(from), int64(to), RescanByAdmin, operator).Scan(&created); err != nil {
		return RescanJob{}, classify(stmt.name, err)
	}
	return RescanJob{ID: id, Network: network, FromBlock: from, ToBlock: &to, NextBlock: from, Status: "running",
		RequestedBy: RescanByAdmin, Operator: operator, CreatedAt: created, UpdatedAt: created}, nil
}

// AddBackfill records that address (registered on network) received
// deposits from block from on, and schedules their scan.
func (db *DB) AddBackfill(ctx context.Context, id, network, address string, from uint64) error {
	tx, err := db.begin(ctx)
	if err != nil {
		return classify("backfill begin", err)
	}
	defer rollbackDetached(ctx, tx)
	stmt := q("scan_backfill_from")
	if _, err := tx.Exec(ctx, stmt.text, network, address, int64(from)); err != nil {
		return classify(stmt.name, err)
	}
	stmt = q("rescan_insert")
	var created time.Time
	if err := tx.QueryRow(ctx, stmt.text, id, network, address, int64(from), int64(from), RescanByBackfill, nil).Scan(&created); err != nil {
		return classify(stmt.name, err)
	}
	return classify("backfill commit", tx.Commit(ctx))
}

// Rescan reads one job; payment.ErrNotFound when there is none.
func (db *DB) Rescan(ctx context.Context, id string) (RescanJob, error) {
	stmt := q("rescan_get")
	var j RescanJob
	var from, to, next int64
	var pending bool
	var waiting *int64
	err := db.pool.QueryRow(ctx, stmt.text, id).Scan(&j.ID, &j.Network, &j.Address, &from, &to, &pending, &next, &j.Status, &j.Error,
		&j.Found, &j.RequestedBy, &j.Operator, &j.CreatedAt, &j.UpdatedAt, &waiting, &j.Restarts, &j.LastRestartAt, &j.LastRestartReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return RescanJob{}, fmt.Errorf("rescan %s: %w", id, payment.ErrNotFound)
	}
	if err != nil {
		return RescanJob{}, classify(stmt.name, err)
	}
	j.FromBlock, j.NextBlock, j.WaitingHead = uint64(from), uint64(next), blockPtr(waiting)
	if !pending {
		end := uint64(max(to, 0))
		j.ToBlock = &end
	}
	return j, nil
}

func blockPtr(n *int64) *uint64 {
	if n == nil {
		return nil
	}
	b := uint64(*n)
	return &b
}

// ResolveBackfills gives the open-ended backfills of networks their end.
func (db *DB) ResolveBackfills(ctx context.Context, networks []string) error {
	stmt := q("rescan_resolve_backfills")
	_, err := db.pool.Exec(ctx, stmt.text, networks)
	return classify(stmt.name, err)
}

// RescanClaim is a leased rescan job: blocks Next through To remain.
type RescanClaim struct {
	ID, Network, Address string
	Next, To             uint64
	// LastHash is the hash of block Next-1 as the job's pass before read
	// it; "" when not known (the job's first pass, or one restarted).
	LastHash string
}

// RescanNetworks names the networks among networks with a job to claim.
func (db *DB) RescanNetworks(ctx context.Context, networks []string) ([]string, error) {
	stmt := q("rescan_networks")
	rows, err := db.pool.Query(ctx, stmt.text, networks)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, classify(stmt.name, err)
}

// MarkRescansWaiting records which running jobs of network wait for the
// chain (next block above head, the finality head just read) and
// answers how many.
func (db *DB) MarkRescansWaiting(ctx context.Context, network string, head uint64) (int, error) {
	stmt := q("rescan_mark_waiting")
	var n int
	err := db.pool.QueryRow(ctx, stmt.text, network, int64(head)).Scan(&n)
	return n, classify(stmt.name, err)
}

// ClaimRescan leases a free running job of network whose next block is
// at or below head, the one whose last pass is oldest; ok false when
// there is none.
func (db *DB) ClaimRescan(ctx context.Context, network string, head uint64, owner string, lease time.Duration) (RescanClaim, bool, error) {
	stmt := q("rescan_claim")
	var c RescanClaim
	var next, to int64
	err := db.pool.QueryRow(ctx, stmt.text, network, owner, lease.Milliseconds(), int64(head)).Scan(&c.ID, &c.Network, &c.Address, &next, &to, &c.LastHash)
	if errors.Is(err, pgx.ErrNoRows) {
		return RescanClaim{}, false, nil
	}
	if err != nil {
		return RescanClaim{}, false, classify(stmt.name, err)
	}
	c.Next, c.To = uint64(next), uint64(to)
	return c, true, nil
}

// CompleteRescanPass stores one pass's deposits of a job and moves the
// job past blocks from through to, recording toHash (block to's hash as
// read; "" when not known) for its next pass; ErrLeaseLost when it is no
// longer this owner's. The job's found grows by the events it had not
// found before: a pass reading blocks again after a restart counts only
// what is new to the job. The job keeps the ids a restart (RestartRescan
// with depth, as its next pass would call it) can read again, and forgets
// the rest.
func (db *DB) CompleteRescanPass(ctx context.Context, id, owner string, from, to uint64, toHash string, depth int64, events []NewEvent) ([]StoredDeposit, error) {
	stmt := q("rescan_advance")
	ids := make([]string, len(events))
	blocks := make([]int64, len(events))
	for i, e := range events {
		ids[i], blocks[i] = e.Event.ID, int64(e.Block)
	}
	return db.inPass(ctx, events, func(tx pgx.Tx) (bool, error) {
		var status string
		err := tx.QueryRow(ctx, stmt.text, id, owner, int64(from), int64(to), ids, toHash, blocks).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, classify(stmt.name, err)
		}
		if status == "done" {
			forget := q("rescan_found_forget")
			if _, err := tx.Exec(ctx, forget.text, id); err != nil {
				return false, classify(forget.name, err)
			}
			return true, nil
		}
		if below, ok := rescanFoundFloor(to, toHash, depth); ok {
			prune := q("rescan_found_prune")
			if _, err := tx.Exec(ctx, prune.text, id, below); err != nil {
				return false, classify(prune.name, err)
			}
		}
		return true, nil
	})
}

// rescanFoundFloor is the block below which a running job's found ids can
// go once its pass read through block to: no restart reads them again.
// A restart starts from the next pass's first block (to+1) and goes back
// depth blocks, or to the job's start when depth is not positive, so then
// every id stays (ok false). Without toHash (finalized) the next pass has
// nothing to link to and cannot restart: none needs keeping. A second
// restart soon after one can go back past the floor of an earlier pass;
// found may then count a transfer there again (it is only a count).
func rescanFoundFloor(to uint64, toHash string, depth int64) (int64, bool) {
	next := int64(to) + 1
	switch {
	case toHash == "":
		return next, true
	case depth <= 0:
		return 0, false
	case next <= depth:
		return 0, false // back to the range's start, at most
	}
	return next - depth, true
}

// RescanRestartReasonMax bounds the reason RestartRescan records: the
// block the job goes back to is added, within last_restart_reason's
// CHECK of 1000 characters (migration 0031).
const RescanRestartReasonMax = 900

// RestartRescan moves a job whose pass starting at next found the branch
// changed under it back depth blocks (its whole range when depth is not
// positive; never before its from_block), forgets its hash, records the
// restart and why (reason, cut to RescanRestartReasonMax characters, and
// the block it goes back to) and gives the lease back; it answers the
// job's next block now. ErrLeaseLost when the job is no longer this
// owner's.
func (db *DB) RestartRescan(ctx context.Context, id, owner string, next uint64, depth int64, reason string) (uint64, error) {
	if reason == "" {
		reason = "restarted"
	}
	if r := []rune(reason); len(r) > RescanRestartReasonMax {
		reason = string(r[:RescanRestartReasonMax])
	}
	stmt := q("rescan_restart")
	var restart int64
	err := db.pool.QueryRow(ctx, stmt.text, id, owner, int64(next), depth, reason).Scan(&restart)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrLeaseLost
	}
	if err != nil {
		return 0, classify(stmt.name, err)
	}
	return uint64(restart), nil
}

// ReleaseRescan gives a failed pass's lease back.
func (db *DB) ReleaseRescan(ctx context.Context, id, owner string) error {
	stmt := q("rescan_release")
	_, err := db.pool.Exec(ctx, stmt.text, id, owner)
	return classify(stmt.name, err)
}

// ErrRescanEnded refuses to cancel a job that is no longer running.
var ErrRescanEnded = fmt.Errorf("%w: the rescan already ended", payment.ErrConflict)

// CancelRescan ends a running job at an operator's request: failed, its
// error "cancelled by <who>: <why>", the one wording settlectl, the admin
// API and the console record. payment.ErrNotFound when there is no job
// id, ErrRescanEnded when it is done or failed already.
func (db *DB) CancelRescan(ctx context.Context, id, who, why string) error {
	tx, err := db.begin(ctx)
	if err != nil {
		return classify("rescan cancel begin", err)
	}
	defer rollbackDetached(ctx, tx)
	stmt := q("rescan_cancel")
	var cancelled, exists bool
	if err := tx.QueryRow(ctx, stmt.text, id, "cancelled by "+who+": "+why).Scan(&cancelled, &exists); err != nil {
		return classify(stmt.name, err)
	}
	switch {
	case cancelled:
		// A statement of its own: it sees the ids of a pass that committed
		// while the cancel waited for the job's row.
		forget := q("rescan_found_forget")
		if _, err := tx.Exec(ctx, forget.text, id); err != nil {
			return classify(forget.name, err)
		}
		return classify("rescan cancel commit", tx.Commit(ctx))
	case exists:
		return fmt.Errorf("rescan %s: %w", id, ErrRescanEnded)
	}
	return fmt.Errorf("rescan %s: %w", id, payment.ErrNotFound)
}

// FailRescan ends a job that can never finish.
func (db *DB) FailRescan(ctx context.Context, id, owner, reason string) error {
	stmt := q("rescan_fail")
	_, err := db.pool.Exec(ctx, stmt.text, id, owner, reason)
	return classify(stmt.name, err)
}

// transfer is the on-chain transfer a scanned deposit names.
func (e NewEvent) transfer() payment.Transfer {
	return payment.Transfer{Network: e.Event.Network, TxHash: e.Event.TxHash, Index: e.Event.TransferIndex}
}
