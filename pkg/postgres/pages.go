package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// Bounds of a page (queries/pages.sql).
const (
	// PageSizeMax is the most rows one page holds.
	PageSizeMax = 1000
	// pageScanRowsMax bounds the rows one page reads when a filter other
	// than the user skips rows: a rare status costs at most this per
	// page, and the page comes back short with has_more.
	pageScanRowsMax = 10 * PageSizeMax
)

// EventKey is an event's place in insertion order: the id of the
// transaction that inserted it, then its id.
type EventKey struct {
	XID     uint64
	EventID string
}

// JournalKey is a journal entry's place in insertion order.
type JournalKey struct {
	XID uint64
	ID  int64
}

// EventFilter narrows a page of events; zero values match everything.
type EventFilter struct {
	UserID int64
	Status payment.Status
	Type   payment.EventType
}

// Page is one page of rows in insertion order. Next is where the
// following page starts, also when HasMore is false (a later call from
// it shows what was inserted since); it is nil only when nothing was
// read and no cursor was given.
type Page[T, K any] struct {
	Rows    []T
	Next    *K
	HasMore bool
}

// JournalEntry is one row of balance_events.
type JournalEntry struct {
	ID            int64
	Asset         string
	Amount        decimal.Decimal
	EventType     string
	SourceEventID string
	CreatedAt     time.Time
	// Network is where the movement happened; "" for rows written before
	// networks existed (theirs is their asset's).
	Network string
}

// EventsPage reads up to size events after the cursor (nil: from the
// start).
func (db *DB) EventsPage(ctx context.Context, f EventFilter, after *EventKey, size int) (Page[EventView, EventKey], error) {
	if size < 1 || size > PageSizeMax {
		return Page[EventView, EventKey]{}, payment.Invalid("page size %d outside 1..%d", size, PageSizeMax)
	}
	start := EventKey{}
	if after != nil {
		start = *after
	}
	args := []any{strconv.FormatUint(start.XID, 10), start.EventID, pageScanRowsMax, nullable(string(f.Status)), nullable(string(f.Type)), size + 1}
	stmt := q("events_page")
	if f.UserID != 0 {
		stmt = q("events_page_by_user")
		args = append(args, f.UserID)
	}
	rows, err := db.pool.Query(ctx, stmt.text, args...)
	if err != nil {
		return Page[EventView, EventKey]{}, classify(stmt.name, err)
	}
	defer rows.Close()
	var events []EventView
	var keys []EventKey
	var trailer *EventKey
	var scanned int64
	for rows.Next() {
		var isTrailer bool
		var n int64
		var xid string
		var scan eventScan
		dest := append([]any{&isTrailer, &n}, scan.dest()...)
		if err := rows.Scan(append(dest, &xid, &scanned)...); err != nil {
			return Page[EventView, EventKey]{}, classify(stmt.name, err)
		}
		key := EventKey{EventID: scan.v.ID}
		if key.XID, err = parseXID(xid); err != nil {
			return Page[EventView, EventKey]{}, err
		}
		if isTrailer {
			trailer = &key
			continue
		}
		events = append(events, scan.view())
		keys = append(keys, key)
	}
	if err := rows.Err(); err != nil {
		return Page[EventView, EventKey]{}, classify(stmt.name, err)
	}
	return buildPage(events, keys, trailer, scanned, size, after), nil
}

// JournalPage reads up to size journal entries of user after the cursor
// (nil: from the start); asset "" is every asset.
func (db *DB) JournalPage(ctx context.Context, user int64, asset string, after *JournalKey, size int) (Page[JournalEntry, JournalKey], error) {
	if size < 1 || size > PageSizeMax {
		return Page[JournalEntry, JournalKey]{}, payment.Invalid("page size %d outside 1..%d", size, PageSizeMax)
	}
	start := JournalKey{}
	if after != nil {
		start = *after
	}
	stmt := q("journal_page")
	rows, err := db.pool.Query(ctx, stmt.text, user, strconv.FormatUint(start.XID, 10), start.ID, pageScanRowsMax, nullable(asset), size+1)
	if err != nil {
		return Page[JournalEntry, JournalKey]{}, classify(stmt.name, err)
	}
	defer rows.Close()
	var entries []JournalEntry
	var keys []JournalKey
	var trailer *JournalKey
	var scanned int64
	for rows.Next() {
		var isTrailer bool
		var xid, amount string
		var e JournalEntry
		if err := rows.Scan(&isTrailer, &xid, &e.ID, &e.Asset, &amount, &e.EventType, &e.SourceEventID, &e.CreatedAt, &scanned, &e.Network); err != nil {
			return Page[JournalEntry, JournalKey]{}, classify(stmt.name, err)
		}
		key := JournalKey{ID: e.ID}
		if key.XID, err = parseXID(xid); err != nil {
			return Page[JournalEntry, JournalKey]{}, err
		}
		if isTrailer {
			trailer = &key
			continue
		}
		if e.Amount, err = decimal.NewFromString(amount); err != nil {
			return Page[JournalEntry, JournalKey]{}, fmt.Errorf("journal entry %d: amount %q: %w", e.ID, amount, err)
		}
		entries = append(entries, e)
		keys = append(keys, key)
	}
	if err := rows.Err(); err != nil {
		return Page[JournalEntry, JournalKey]{}, classify(stmt.name, err)
	}
	return buildPage(entries, keys, trailer, scanned, size, after), nil
}

// buildPage cuts the rows of a page query (size+1 asked for) into a
// page. trailer is the last row scanned, scanned how many were.
func buildPage[T, K any](rows []T, keys []K, trailer *K, scanned int64, size int, after *K) Page[T, K] {
	switch {
	case len(rows) > size:
		return Page[T, K]{Rows: rows[:size], Next: &keys[size-1], HasMore: true}
	case trailer != nil:
		// Past the last row scanned: the rows skipped there did not
		// match, and a full scan means more may follow.
		return Page[T, K]{Rows: rows, Next: trailer, HasMore: scanned >= pageScanRowsMax}
	}
	return Page[T, K]{Rows: rows, Next: after}
}

// parseXID reads an xid8 column read as text.
func parseXID(s string) (uint64, error) {
	xid, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("insert_xid %q: %w", s, err)
	}
	return xid, nil
}
