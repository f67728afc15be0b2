package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// Bounds of the console's reads (pkg/console).
const (
	// StoryRowsMax bounds each list of an event's story (journal rows,
	// dead-letter attempts).
	StoryRowsMax = 200
	// ConsoleListMax bounds the console's event lists.
	ConsoleListMax = 200
	// TxSearchTimeout bounds the search by transaction hash, which has no
	// index on payment_events; its claims are found either way.
	TxSearchTimeout = 3 * time.Second
	// RescanJobsMax bounds the listing of rescan jobs.
	RescanJobsMax = 200
)

// EventDetail is an event row with everything the console's story shows.
type EventDetail struct {
	EventView
	TaskID        string
	Network       string
	HoldID        string
	ToAddress     string
	BlockHash     string
	TransferIndex string
	ReceiptSeenAt *time.Time
	ReopenedAt    *time.Time
	AbsentSince   *time.Time
	AbsentHead    *int64
	// TraceParent is the W3C traceparent stored with the event ("" for
	// none); TraceID is its trace.
	TraceParent string
}

// Processed is an event's idempotency record.
type Processed struct {
	Key       string
	Outcome   string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Claim is the chain_transfers row an event holds.
type Claim struct {
	Network       string
	TxHash        string
	TransferIndex string
	Asset         string
	BlockHash     string
	LogPosition   *int32
	CreatedAt     time.Time
}

// Story is everything stored about one event, read in one snapshot.
type Story struct {
	Event         EventDetail
	Processed     *Processed
	Journal       []JournalEntry
	DeadLetters   []DeadLetterView
	Notifications []NotificationView
	Claim         *Claim
	// Reports are the providers that reported the event's transfer, the
	// first first (the event's source is the one that stored it).
	Reports  []Report
	Rechecks []Recheck
	// Compensation is the reorg compensation of a deposit, or the deposit
	// a compensation reverses.
	Related *EventView
	// Hold is the hold the event opened, posted or voided.
	Hold *Hold
}

// notificationKinds are every kind notification_outbox holds: an event's
// notifications are found by their delivery ids.
// TestNotificationKindsListed keeps it complete.
var notificationKinds = []string{NotifyDepositCredited, NotifyWithdrawalConfirmed, NotifyInsufficientFunds, NotifyDepositReversed,
	NotifyWithdrawalPosted, NotifyHoldVoided}

// EventStory reads an event's whole story; payment.ErrNotFound if there is
// no such event.
func (db *DB) EventStory(ctx context.Context, eventID string) (Story, error) {
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}))
	if err != nil {
		return Story{}, classify("event story", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var s Story
	if s.Event, err = eventDetail(ctx, tx, eventID); err != nil {
		return Story{}, err
	}
	steps := []func() error{
		func() error { return storyProcessed(ctx, tx, &s) },
		func() error { return storyJournal(ctx, tx, &s) },
		func() error { return storyDeadLetters(ctx, tx, &s) },
		func() error { return storyNotifications(ctx, tx, &s) },
		func() error { return storyClaim(ctx, tx, &s) },
		func() error { return storyReports(ctx, tx, &s) },
		func() error { return storyRechecks(ctx, tx, &s) },
		func() error { return storyRelated(ctx, tx, &s) },
		func() error { return storyHold(ctx, tx, &s) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return Story{}, err
		}
	}
	return s, classify("event story", tx.Commit(ctx))
}

func eventDetail(ctx context.Context, tx pgx.Tx, eventID string) (EventDetail, error) {
	stmt := q("console_event_detail")
	var scan eventScan
	var d EventDetail
	dest := append(scan.dest(), &d.TaskID, &d.Network, &d.HoldID, &d.ToAddress, &d.BlockHash, &d.TransferIndex,
		&d.ReceiptSeenAt, &d.ReopenedAt, &d.AbsentSince, &d.AbsentHead, &d.TraceParent)
	err := tx.QueryRow(ctx, stmt.text, eventID).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventDetail{}, fmt.Errorf("event %s: %w", eventID, payment.ErrNotFound)
	}
	if err != nil {
		return EventDetail{}, classify(stmt.name, err)
	}
	d.EventView = scan.view()
	return d, nil
}

func storyProcessed(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("console_processed")
	p := Processed{Key: payment.IdempotencyKey(s.Event.ID, s.Event.Type)}
	err := tx.QueryRow(ctx, stmt.text, p.Key).Scan(&p.Outcome, &p.CreatedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // not yet processed, or cleaned up after 14 days
	}
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Processed = &p
	return nil
}

func storyJournal(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("console_journal_of_event")
	rows, err := tx.Query(ctx, stmt.text, s.Event.ID, StoryRowsMax)
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Journal, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (JournalEntry, error) {
		var j JournalEntry
		var amount string
		if err := row.Scan(&j.ID, &j.Asset, &amount, &j.EventType, &j.SourceEventID, &j.CreatedAt); err != nil {
			return j, err
		}
		j.Amount = decimal.RequireFromString(amount)
		return j, nil
	})
	return classify(stmt.name, err)
}

func storyDeadLetters(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("console_dlq_of_event")
	rows, err := tx.Query(ctx, stmt.text, s.Event.ID, StoryRowsMax)
	if err != nil {
		return classify(stmt.name, err)
	}
	s.DeadLetters, err = pgx.CollectRows(rows, scanDeadLetter)
	return classify(stmt.name, err)
}

func storyNotifications(ctx context.Context, tx pgx.Tx, s *Story) error {
	ids := make([]string, 0, len(notificationKinds))
	for _, kind := range notificationKinds {
		ids = append(ids, kind+":"+s.Event.ID)
	}
	stmt := q("console_notifications_of_event")
	rows, err := tx.Query(ctx, stmt.text, ids, NotificationAttemptsShown)
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Notifications, err = pgx.CollectRows(rows, scanNotification)
	return classify(stmt.name, err)
}

func storyClaim(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("console_claim_of_event")
	var c Claim
	err := tx.QueryRow(ctx, stmt.text, s.Event.ID).Scan(&c.Network, &c.TxHash, &c.TransferIndex, &c.Asset, &c.BlockHash, &c.LogPosition, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Claim = &c
	return nil
}

func storyReports(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("event_reports")
	rows, err := tx.Query(ctx, stmt.text, s.Event.ID)
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Reports, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Report, error) {
		var r Report
		return r, row.Scan(&r.Reporter, &r.FirstAt)
	})
	return classify(stmt.name, err)
}

func storyRechecks(ctx context.Context, tx pgx.Tx, s *Story) error {
	stmt := q("rechecks_of_event")
	rows, err := tx.Query(ctx, stmt.text, s.Event.ID, RechecksListMax)
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Rechecks, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Recheck, error) {
		var r Recheck
		var result string
		err := row.Scan(&r.ID, &r.EventID, &r.RequestedBy, &r.ChainState, &result, &r.Detail, &r.CreatedAt)
		r.Result = RecheckResult(result)
		return r, err
	})
	return classify(stmt.name, err)
}

// storyRelated finds the compensation of a deposit ("reorg:" + its id) or
// the deposit a compensation reverses.
func storyRelated(ctx context.Context, tx pgx.Tx, s *Story) error {
	related := s.Event.Related
	if related == "" {
		related = "reorg:" + s.Event.ID
	}
	stmt := q("get_event")
	var scan eventScan
	err := tx.QueryRow(ctx, stmt.text, related).Scan(scan.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return classify(stmt.name, err)
	}
	v := scan.view()
	s.Related = &v
	return nil
}

func storyHold(ctx context.Context, tx pgx.Tx, s *Story) error {
	holdID := s.Event.HoldID
	if s.Event.Type == payment.WithdrawalHold {
		holdID = s.Event.ID
	}
	if holdID == "" {
		return nil
	}
	stmt := q("get_hold")
	h, err := scanHold(tx.QueryRow(ctx, stmt.text, holdID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return classify(stmt.name, err)
	}
	s.Hold = &h
	return nil
}

// RecentEvents lists the newest events, at most ConsoleListMax.
func (db *DB) RecentEvents(ctx context.Context, limit int) ([]EventView, error) {
	return db.eventList(ctx, q("console_recent_events"), min(max(limit, 1), ConsoleListMax))
}

// UserEvents lists a user's newest events, at most ConsoleListMax.
func (db *DB) UserEvents(ctx context.Context, user int64, limit int) ([]EventView, error) {
	return db.eventList(ctx, q("console_events_of_user"), user, min(max(limit, 1), ConsoleListMax))
}

func (db *DB) eventList(ctx context.Context, stmt query, args ...any) ([]EventView, error) {
	rows, err := db.pool.Query(ctx, stmt.text, args...)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, scanEventRow)
	return out, classify(stmt.name, err)
}

func scanEventRow(row pgx.CollectableRow) (EventView, error) {
	var scan eventScan
	if err := row.Scan(scan.dest()...); err != nil {
		return EventView{}, err
	}
	return scan.view(), nil
}

// TxEvents are the events naming one transaction.
type TxEvents struct {
	Events []EventView
	// Partial: the scan of unclaimed events ran out of TxSearchTimeout;
	// Events holds the claimed ones.
	Partial bool
}

// EventsOfTx finds the events naming txHash: those holding one of its
// transfers (by the chain_transfers key) and, within TxSearchTimeout,
// any other event naming it.
func (db *DB) EventsOfTx(ctx context.Context, txHash string) (TxEvents, error) {
	networks, err := db.Networks(ctx)
	if err != nil {
		return TxEvents{}, err
	}
	stmt := q("console_claims_of_tx")
	rows, err := db.pool.Query(ctx, stmt.text, networks, txHash, ConsoleListMax)
	if err != nil {
		return TxEvents{}, classify(stmt.name, err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return TxEvents{}, classify(stmt.name, err)
	}
	scanned, scanErr := db.scanTx(ctx, txHash)
	var out TxEvents
	seen := map[string]bool{}
	if errors.Is(scanErr, payment.ErrRetryable) {
		out.Partial = true // the statement timeout (57014) cut the scan short
	} else if scanErr != nil {
		return TxEvents{}, scanErr
	}
	for _, e := range scanned {
		seen[e.ID] = true
		out.Events = append(out.Events, e)
	}
	for _, id := range claimed {
		if seen[id] {
			continue
		}
		e, err := db.Event(ctx, id)
		if errors.Is(err, payment.ErrNotFound) {
			continue
		}
		if err != nil {
			return TxEvents{}, err
		}
		out.Events = append(out.Events, e)
	}
	return out, nil
}

func (db *DB) scanTx(ctx context.Context, txHash string) ([]EventView, error) {
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{AccessMode: pgx.ReadOnly}))
	if err != nil {
		return nil, classify("events of tx", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("console_search_settings")
	if _, err := tx.Exec(ctx, stmt.text, fmt.Sprintf("%dms", TxSearchTimeout.Milliseconds())); err != nil {
		return nil, classify(stmt.name, err)
	}
	stmt = q("console_events_of_tx")
	rows, err := tx.Query(ctx, stmt.text, txHash, ConsoleListMax)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, scanEventRow)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	return out, classify("events of tx", tx.Commit(ctx))
}

// Networks lists the network names settle knows: the networks table's
// where it exists (migration 0012), and the assets'.
func (db *DB) Networks(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(stmt query) error {
		rows, err := db.pool.Query(ctx, stmt.text)
		if err != nil {
			return classify(stmt.name, err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return classify(stmt.name, err)
		}
		for _, n := range names {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
		return nil
	}
	registry, err := db.tableExists(ctx, "networks")
	if err != nil {
		return nil, err
	}
	if registry {
		if err := add(q("console_registered_networks")); err != nil {
			return nil, err
		}
	}
	return out, add(q("console_networks"))
}

func (db *DB) tableExists(ctx context.Context, name string) (bool, error) {
	stmt := q("console_table_exists")
	var ok bool
	err := db.pool.QueryRow(ctx, stmt.text, name).Scan(&ok)
	return ok, classify(stmt.name, err)
}

// OpenDeadLetters counts open DLQ entries and the age of the oldest.
func (db *DB) OpenDeadLetters(ctx context.Context) (int64, time.Duration, error) {
	stmt := q("console_dlq_open_count")
	var n int64
	var seconds float64
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&n, &seconds); err != nil {
		return 0, 0, classify(stmt.name, err)
	}
	return n, time.Duration(seconds * float64(time.Second)), nil
}

// ScanCursor is a chain scanner's durable cursor.
type ScanCursor struct {
	Network   string
	NextBlock int64
	UpdatedAt time.Time
	Age       time.Duration
}

// ScanCursors lists the scanners' cursors; found is false when the table
// does not exist (no scanner in this deployment's schema).
func (db *DB) ScanCursors(ctx context.Context) (cursors []ScanCursor, found bool, err error) {
	if found, err = db.tableExists(ctx, "chain_cursors"); err != nil || !found {
		return nil, found, err
	}
	stmt := q("console_chain_cursors")
	rows, err := db.pool.Query(ctx, stmt.text)
	if err != nil {
		return nil, true, classify(stmt.name, err)
	}
	cursors, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScanCursor, error) {
		var c ScanCursor
		var seconds float64
		err := row.Scan(&c.Network, &c.NextBlock, &c.UpdatedAt, &seconds)
		c.Age = time.Duration(seconds * float64(time.Second))
		return c, err
	})
	return cursors, true, classify(stmt.name, err)
}

// RescanJobs lists the newest rescan jobs (scan.go's RescanJob); found is
// false when the table does not exist.
func (db *DB) RescanJobs(ctx context.Context, limit int) (jobs []RescanJob, found bool, err error) {
	if found, err = db.tableExists(ctx, "rescan_jobs"); err != nil || !found {
		return nil, found, err
	}
	stmt := q("console_rescan_jobs")
	rows, err := db.pool.Query(ctx, stmt.text, min(max(limit, 1), RescanJobsMax))
	if err != nil {
		return nil, true, classify(stmt.name, err)
	}
	jobs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (RescanJob, error) {
		var j RescanJob
		var from, next int64
		var to, waiting *int64
		err := row.Scan(&j.ID, &j.Network, &j.Address, &from, &to, &next, &j.Status, &j.Error,
			&j.Found, &j.RequestedBy, &j.Operator, &j.CreatedAt, &j.UpdatedAt, &waiting, &j.Restarts, &j.LastRestartAt, &j.LastRestartReason)
		j.FromBlock, j.NextBlock, j.WaitingHead = uint64(from), uint64(next), blockPtr(waiting)
		if to != nil {
			end := uint64(*to)
			j.ToBlock = &end
		}
		return j, err
	})
	return jobs, true, classify(stmt.name, err)
}
