package postgres

import (
	"context"
	"errors"
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
// A day whose records are already in the default partition is moved while
// holding that lock, each statement of the move at most
// PartitionMoveTimeoutDefault: with the lock wait, its three that scan or
// write the records take less than LedgerLockTimeoutDefault together, so
// the ledger's writes queued behind the move wait and do not fail.
const (
	PartitionLockTimeoutDefault = 100 * time.Millisecond
	PartitionMoveTimeoutDefault = 500 * time.Millisecond
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
	// the lock timeout on any try; the next run does them (a day that is
	// past by then stays in the default partition).
	Deferred []string
	// Moved counts records of today (or a later day) that had fallen into
	// the default partition for want of their day's partition, and were
	// moved into it when this run created it.
	Moved int64
	// Skipped names the days left to the default partition: their records
	// were there and could not be moved within the move timeout.
	Skipped []string
	// DefaultRows counts records that fell outside every daily partition
	// and are still in the default partition.
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
	// MoveTimeout bounds each statement of a day's move out of the
	// default partition.
	MoveTimeout time.Duration
	// Trim bounds the batches that delete old rows outside the daily
	// partitions.
	Trim CleanupOptions
}

// MaintainPartitions keeps processed_events' daily partitions: it creates
// the days ahead, drops whole days past retention (never one that still
// holds a pending record), and trims the rows from before partitioning
// out of their legacy partition, dropping it once it is empty. DDL that
// cannot get its lock in time is reported in Deferred, not as an error.
// A failure on one partition does not stop the others: every step runs,
// and the failures are returned together at the end.
func (db *DB) MaintainPartitions(ctx context.Context, retention time.Duration, ahead int, now time.Time, o PartitionOptions) (PartitionReport, error) {
	if o.LockTimeout <= 0 {
		o.LockTimeout = PartitionLockTimeoutDefault
	}
	if o.PauseFirst <= 0 {
		o.PauseFirst = partitionDDLPauseFirst
	}
	if o.MoveTimeout <= 0 {
		o.MoveTimeout = PartitionMoveTimeoutDefault
	}
	var r PartitionReport
	var errs []error
	// One day per statement, so a lock timeout costs only that day.
	var today time.Time
	if err := db.pool.QueryRow(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&today); err != nil {
		return r, classify("partition day", err)
	}
	for i := range ahead {
		day := today.Add(time.Duration(i) * 24 * time.Hour)
		if err := db.createPartition(ctx, o, day, &r); err != nil {
			if ctx.Err() != nil {
				return r, err
			}
			errs = append(errs, err)
		}
	}
	if err := db.dropPartitions(ctx, retention, now, o, &r); err != nil {
		if ctx.Err() != nil {
			return r, errors.Join(append(errs, err)...)
		}
		errs = append(errs, err)
	}
	stmt := q("default_partition_rows")
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&r.DefaultRows); err != nil {
		return r, errors.Join(append(errs, classify(stmt.name, err))...)
	}
	trimmed, err := db.trimLegacy(ctx, retention, o, &r)
	r.Trimmed = trimmed
	return r, errors.Join(append(errs, err)...)
}

// createPartition creates day's partition. When the default partition
// already holds records of that day (its partition went missing: the
// cleanup did not run for PartitionsAheadDefault days, or deferred the
// day every time), CREATE fails on them, and they are moved instead.
func (db *DB) createPartition(ctx context.Context, o PartitionOptions, day time.Time, r *PartitionReport) error {
	stmt := q("partitions_ahead")
	var created int
	done, err := db.partitionDDL(ctx, o, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, stmt.text, day).Scan(&created)
	})
	if isCode(err, codeCheckViolation) {
		return db.movePartitionDay(ctx, o, day, r)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", partitionName(day), classify(stmt.name, err))
	}
	if !done {
		r.Deferred = append(r.Deferred, partitionName(day))
	}
	r.Created += created
	return nil
}

// movePartitionDay moves day's records out of the default partition into
// a staging table, creates the day's partition and moves them into it,
// all in one transaction that holds ACCESS EXCLUSIVE on processed_events
// from the start: the ledger's writes and reads wait for it and then find
// every record in its day's partition, none missing meanwhile. A move that
// outlasts the move timeout is rolled back and the day left to the default
// partition (Skipped): a stall of the ledger would cost more than records
// out of place, which the retention trim deletes like the others.
func (db *DB) movePartitionDay(ctx context.Context, o PartitionOptions, day time.Time, r *PartitionReport) error {
	var created int
	var moved int64
	name := "partition_move"
	done, err := db.partitionDDL(ctx, o, func(tx pgx.Tx) error {
		steps := []struct {
			stmt query
			args []any
		}{
			{q("partition_move_timeout"), []any{durationSetting(o.MoveTimeout)}},
			{q("partition_move_lock"), nil},
			{q("partition_move_stage"), nil},
			{q("partition_move_out"), []any{day, day.Add(24 * time.Hour)}},
		}
		for _, step := range steps {
			name = step.stmt.name
			if _, err := tx.Exec(ctx, step.stmt.text, step.args...); err != nil {
				return err
			}
		}
		stmt := q("partitions_ahead")
		name = stmt.name
		if err := tx.QueryRow(ctx, stmt.text, day).Scan(&created); err != nil {
			return err
		}
		stmt = q("partition_move_in")
		name = stmt.name
		tag, err := tx.Exec(ctx, stmt.text)
		moved = tag.RowsAffected()
		return err
	})
	if isCode(err, codeQueryCanceled) && ctx.Err() == nil {
		r.Skipped = append(r.Skipped, partitionName(day))
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", partitionName(day), classify(name, err))
	}
	if !done {
		r.Deferred = append(r.Deferred, partitionName(day))
		return nil
	}
	r.Created += created
	r.Moved += moved
	return nil
}

// dropPartitions drops the daily partitions past retention that hold no
// pending record.
func (db *DB) dropPartitions(ctx context.Context, retention time.Duration, now time.Time, o PartitionOptions, r *PartitionReport) error {
	stmt := q("processed_partitions")
	rows, err := db.pool.Query(ctx, stmt.text)
	if err != nil {
		return classify(stmt.name, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return classify(stmt.name, err)
	}
	var errs []error
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
			return errors.Join(append(errs, fmt.Errorf("%s: %w", name, classify(stmt.name, err)))...)
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
			if ctx.Err() != nil {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, fmt.Errorf("%s: %w", name, classify(stmt.name, err)))
			continue
		}
		if !done {
			r.Deferred = append(r.Deferred, name)
			continue
		}
		r.Dropped++
	}
	return errors.Join(errs...)
}

const partitionPrefix = "processed_events_p"

func partitionName(day time.Time) string { return partitionPrefix + day.UTC().Format("20060102") }

// partitionDDL runs ddl in its own transaction under the lock timeout,
// trying again after a pause when the lock did not come in time. It
// reports false, without an error, when every try timed out.
func (db *DB) partitionDDL(ctx context.Context, o PartitionOptions, ddl func(pgx.Tx) error) (bool, error) {
	pause := o.PauseFirst
	for try := 1; ; try++ {
		err := pgx.BeginTxFunc(ctx, db.pool, bounded(pgx.TxOptions{}), func(tx pgx.Tx) error {
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
	trimmed, err := db.trimProcessed(ctx, retention, o.Trim)
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
