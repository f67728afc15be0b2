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

// Bounds of the partition DDL. CREATE TABLE … PARTITION OF and DROP TABLE
// of a partition take ACCESS EXCLUSIVE on processed_events; while one
// waits for its lock (behind a pg_dump, say) every ledger write queues
// behind it. So each statement waits at most PartitionLockTimeoutDefault,
// is tried partitionDDLTries times with a growing pause, and is then left
// for the next run: with 30 days created ahead, a skipped day is harmless.
const (
	PartitionLockTimeoutDefault = 100 * time.Millisecond
	partitionDDLTries           = 3
	partitionDDLPauseFirst      = 250 * time.Millisecond
)

// PartitionReport says what MaintainPartitions did.
type PartitionReport struct {
	Created, Dropped int
	// KeptPending names old partitions not dropped because they still hold
	// pending records (the zombie check reports those).
	KeptPending []string
	// Deferred names the partitions whose DDL did not get its lock within
	// the lock timeout on any try; the next run does them.
	Deferred []string
	// DefaultRows counts records that fell outside every daily partition.
	DefaultRows int64
	// Trimmed counts rows deleted from the pre-partitioning partition.
	Trimmed int64
}

// PartitionOptions bound MaintainPartitions' DDL; zero values are the
// defaults.
type PartitionOptions struct {
	// LockTimeout bounds each DDL statement's wait for its lock
	// (PARTITION_LOCK_TIMEOUT).
	LockTimeout time.Duration
	// PauseFirst is the pause before the second try; it doubles.
	PauseFirst time.Duration
}

// MaintainPartitions keeps processed_events' daily partitions: it creates
// the days ahead, drops whole days past retention (never one that still
// holds a pending record), and trims the rows from before partitioning
// out of their legacy partition, dropping it once it is empty. DDL that
// cannot get its lock in time is reported in Deferred, not as an error.
func (db *DB) MaintainPartitions(ctx context.Context, retention time.Duration, ahead int, now time.Time, o PartitionOptions) (PartitionReport, error) {
	if o.LockTimeout <= 0 {
		o.LockTimeout = PartitionLockTimeoutDefault
	}
	if o.PauseFirst <= 0 {
		o.PauseFirst = partitionDDLPauseFirst
	}
	var r PartitionReport
	// One day per statement, so a lock timeout costs only that day.
	var today time.Time
	if err := db.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&today); err != nil {
		return r, classify("partition day", err)
	}
	stmt := q("partitions_ahead")
	for i := range ahead {
		day := today.Add(time.Duration(i) * 24 * time.Hour)
		var created int
		done, err := db.partitionDDL(ctx, o, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, stmt.text, day).Scan(&created)
		})
		if err != nil {
			return r, classify(stmt.name, err)
		}
		if !done {
			r.Deferred = append(r.Deferred, partitionName(day))
		}
		r.Created += created
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
		day, err := time.Parse("20060102", strings.TrimPrefix(name, partitionPrefix))
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
		done, err := db.partitionDDL(ctx, o, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(stmt.text, ident))
			return err
		})
		if err != nil {
			return r, classify(stmt.name, err)
		}
		if !done {
			r.Deferred = append(r.Deferred, name)
			continue
		}
		r.Dropped++
	}
	stmt = q("default_partition_rows")
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&r.DefaultRows); err != nil {
		return r, classify(stmt.name, err)
	}
	if r.Trimmed, err = db.trimLegacy(ctx, retention, o, &r); err != nil {
		return r, err
	}
	return r, nil
}

const partitionPrefix = "processed_events_p"

func partitionName(day time.Time) string { return partitionPrefix + day.UTC().Format("20060102") }

// partitionDDL runs ddl in its own transaction under the lock timeout,
// trying again after a pause when the lock did not come in time. It
// reports false, without an error, when every try timed out.
func (db *DB) partitionDDL(ctx context.Context, o PartitionOptions, ddl func(pgx.Tx) error) (bool, error) {
	pause := o.PauseFirst
	for try := 1; ; try++ {
		err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, q("partition_lock_timeout").text, durationSetting(o.LockTimeout)); err != nil {
				return err
			}
			return ddl(tx)
		})
		if !isCode(err, codeLockNotAvailable) {
			return err == nil, err
		}
		if try == partitionDDLTries {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// trimLegacy deletes old terminal rows that no dropped day takes with it:
// those of the partition that holds the records written before
// partitioning, which it drops once empty, and those that fell into the
// default partition (r.DefaultRows), whether or not the legacy one is
// still there.
func (db *DB) trimLegacy(ctx context.Context, retention time.Duration, o PartitionOptions, r *PartitionReport) (int64, error) {
	var exists bool
	if err := db.pool.QueryRow(ctx, `SELECT to_regclass('processed_events_legacy') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, classify("legacy partition", err)
	}
	if !exists && r.DefaultRows == 0 {
		return 0, nil
	}
	trimmed, err := db.CleanupProcessed(ctx, retention, CleanupBatchDefault, CleanupPauseDefault)
	if err != nil || !exists {
		return trimmed, err
	}
	var left int64
	var past bool
	stmt := q("legacy_partition")
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&left, &past); err != nil {
		return trimmed, classify(stmt.name, err)
	}
	// Empty and past its range: nothing will ever be written there again.
	if left == 0 && past {
		done, err := db.partitionDDL(ctx, o, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(q("drop_partition").text, "processed_events_legacy"))
			return err
		})
		if err != nil {
			return trimmed, classify("drop legacy partition", err)
		}
		if !done {
			r.Deferred = append(r.Deferred, "processed_events_legacy")
		}
	}
	return trimmed, nil
}
