package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// PartitionsAheadDefault is how many daily partitions of processed_events
// exist ahead of today.
const PartitionsAheadDefault = 30

// PartitionReport says what MaintainPartitions did.
type PartitionReport struct {
	Created, Dropped int
	// KeptPending names old partitions not dropped because they still hold
	// pending records (the zombie check reports those).
	KeptPending []string
	// DefaultRows counts records that fell outside every daily partition.
	DefaultRows int64
	// Trimmed counts rows deleted from the pre-partitioning partition.
	Trimmed int64
}

// MaintainPartitions keeps processed_events' daily partitions: it creates
// the days ahead, drops whole days past retention (never one that still
// holds a pending record), and trims the rows from before partitioning
// out of their legacy partition, dropping it once it is empty.
func (db *DB) MaintainPartitions(ctx context.Context, retention time.Duration, ahead int, now time.Time) (PartitionReport, error) {
	var r PartitionReport
	stmt := q("partitions_ahead")
	if err := db.pool.QueryRow(ctx, stmt.text, ahead).Scan(&r.Created); err != nil {
		return r, classify(stmt.name, err)
	}
	stmt = q("processed_partitions")
	rows, err := db.pool.Query(ctx, stmt.text)
	if err != nil {
		return r, classify(stmt.name, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return r, classify(stmt.name, err)
	}
	cutoff := now.UTC().Add(-retention)
	for _, name := range names {
		day, err := time.Parse("20060102", strings.TrimPrefix(name, "processed_events_p"))
		if err != nil || !day.Add(24*time.Hour).Before(cutoff) {
			continue
		}
		ident := pgx.Identifier{name}.Sanitize()
		var pending bool
		stmt := q("partition_has_pending")
		if err := db.pool.QueryRow(ctx, fmt.Sprintf(stmt.text, ident)).Scan(&pending); err != nil {
			return r, classify(stmt.name, err)
		}
		if pending {
			r.KeptPending = append(r.KeptPending, name)
			continue
		}
		stmt = q("drop_partition")
		if _, err := db.pool.Exec(ctx, fmt.Sprintf(stmt.text, ident)); err != nil {
			return r, classify(stmt.name, err)
		}
		r.Dropped++
	}
	stmt = q("default_partition_rows")
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&r.DefaultRows); err != nil {
		return r, classify(stmt.name, err)
	}
	if r.Trimmed, err = db.trimLegacy(ctx, retention); err != nil {
		return r, err
	}
	return r, nil
}

// trimLegacy deletes old terminal rows from the partition that holds the
// records written before partitioning, and drops it once it is empty.
func (db *DB) trimLegacy(ctx context.Context, retention time.Duration) (int64, error) {
	var exists bool
	if err := db.pool.QueryRow(ctx, `SELECT to_regclass('processed_events_legacy') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, classify("legacy partition", err)
	}
	if !exists {
		return 0, nil
	}
	trimmed, err := db.CleanupProcessed(ctx, retention, CleanupBatchDefault, CleanupPauseDefault)
	if err != nil {
		return trimmed, err
	}
	var left int64
	var bound time.Time
	stmt := q("legacy_partition")
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&left, &bound); err != nil {
		return trimmed, classify(stmt.name, err)
	}
	// Empty and past its range: nothing will ever be written there again.
	if left == 0 && time.Now().After(bound) {
		if _, err := db.pool.Exec(ctx, fmt.Sprintf(q("drop_partition").text, "processed_events_legacy")); err != nil {
			return trimmed, classify("drop legacy partition", err)
		}
	}
	return trimmed, nil
}
