package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BacklogTimeoutDefault bounds the backlog read; a slower answer is an
// error (the gauges keep their last values) rather than a stalled scrape.
const BacklogTimeoutDefault = 5 * time.Second

// BacklogCount is the number of events of one status on one network.
type BacklogCount struct {
	Status  string
	Network string
	Events  int64
}

// Backlog is the real backlog, the one waiting in PostgreSQL.
type Backlog struct {
	// Counts has live statuses (pending, enqueued, processing,
	// awaiting_finality) and failed events with an open dead letter;
	// a (status, network) with no events is absent.
	Counts []BacklogCount
	// OldestPending is the age of the oldest pending event, 0 when none.
	OldestPending time.Duration
}

// Backlog reads the backlog from the partial status indexes, in one
// snapshot, bounded by timeout.
func (db *DB) Backlog(ctx context.Context, timeout time.Duration) (Backlog, error) {
	var b Backlog
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}))
	if err != nil {
		return b, classify("backlog", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := q("backlog_settings")
	// At least 1ms: PostgreSQL reads 0 as no timeout at all.
	if _, err := tx.Exec(ctx, stmt.text, fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1))); err != nil {
		return b, classify(stmt.name, err)
	}
	stmt = q("backlog_counts")
	rows, err := tx.Query(ctx, stmt.text)
	if err != nil {
		return b, classify(stmt.name, err)
	}
	for rows.Next() {
		var c BacklogCount
		if err := rows.Scan(&c.Status, &c.Network, &c.Events); err != nil {
			rows.Close()
			return b, classify(stmt.name, err)
		}
		b.Counts = append(b.Counts, c)
	}
	if err := rows.Err(); err != nil {
		return b, classify(stmt.name, err)
	}
	stmt = q("backlog_oldest_pending")
	var seconds float64
	if err := tx.QueryRow(ctx, stmt.text).Scan(&seconds); err != nil {
		return b, classify(stmt.name, err)
	}
	b.OldestPending = time.Duration(seconds * float64(time.Second))
	return b, classify("backlog", tx.Commit(ctx))
}
