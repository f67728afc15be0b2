package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cleanup bounds. Every delete of the cleanup goes in batches of at most
// CLEANUP_BATCH rows, each its own transaction under
// CLEANUP_BATCH_TIMEOUT: no batch holds its locks, its transaction or
// the run for long, whatever the backlog.
const (
	CleanupRetentionDefault    = 14 * 24 * time.Hour
	CleanupBatchDefault        = 5000
	CleanupBatchMax            = 50000
	CleanupBatchTimeoutDefault = 30 * time.Second
	CleanupPauseDefault        = 100 * time.Millisecond
	// CleanupBatchesMax bounds the batches of the processed_events trim in
	// one run: it runs before the other tables' cleanup, which must still
	// get their turn within the job's hour.
	CleanupBatchesMax = 200
)

// Tables the cleanup deletes from, as CleanupReport.Table names them.
const (
	CleanupNotifications   = "notification_outbox"
	CleanupTransferReports = "transfer_reports"
	CleanupSightings       = "transfer_sightings"
	CleanupRescanFound     = "rescan_found"
	cleanupProcessed       = "processed_events"
)

// cleanupTables are the tables Cleanup takes turns on, each with its
// one-batch delete taking (retention interval, batch size), or the batch
// size alone when its rows go whatever their age (anyAge).
var cleanupTables = []struct {
	table  string
	query  string
	anyAge bool
}{
	{table: CleanupNotifications, query: "cleanup_notifications"},
	{table: CleanupTransferReports, query: "delete_old_reports"},
	{table: CleanupSightings, query: "delete_old_sightings"},
	{table: CleanupRescanFound, query: "cleanup_rescan_found", anyAge: true},
}

// CleanupOptions bound the cleanup's deletes; zero values are the
// defaults.
type CleanupOptions struct {
	// Batch is the most rows one batch deletes (CLEANUP_BATCH).
	Batch int
	// BatchTimeout bounds one batch: its statement_timeout, and a little
	// more on the client's side for a server gone silent
	// (CLEANUP_BATCH_TIMEOUT).
	BatchTimeout time.Duration
	// Pause is the rest between two rounds of batches.
	Pause time.Duration
	// Deleted, if set, is told each committed batch's rows as it goes.
	Deleted func(table string, rows int64)
}

func (o CleanupOptions) withDefaults() (CleanupOptions, error) {
	if o.Batch == 0 {
		o.Batch = CleanupBatchDefault
	}
	if o.Batch < 1 || o.Batch > CleanupBatchMax {
		return o, fmt.Errorf("cleanup batch %d outside 1..%d", o.Batch, CleanupBatchMax)
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = CleanupBatchTimeoutDefault
	}
	if o.Pause <= 0 {
		o.Pause = CleanupPauseDefault
	}
	return o, nil
}

// CleanupReport says what the cleanup did to one table.
type CleanupReport struct {
	Table string
	// Deleted and Batches count the rows and the committed batches.
	Deleted int64
	Batches int
	// Done: a batch came back short, so nothing past retention is left
	// (but rows locked meanwhile, which the next run takes).
	Done bool
	// Err is the failed batch that ended this table's cleanup for the
	// run, or the run's end with rows left.
	Err error
}

// Cleanup deletes the settled notifications, transfer reports and
// transfer sightings older than retention (a transfer with a block
// reported removed keeps its sightings), and the found ids of rescan jobs
// that ended (rescan_found), one batch of each table in turn,
// until every table is done or ctx ends. A batch that fails or times out
// ends its own table's cleanup for this run, not the others'. The reports
// are in cleanupTables' order; the error joins the tables' errors.
func (db *DB) Cleanup(ctx context.Context, retention time.Duration, o CleanupOptions) ([]CleanupReport, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	reports := make([]CleanupReport, len(cleanupTables))
	for i, t := range cleanupTables {
		reports[i].Table = t.table
	}
	// Turns, not one table after the other: a large backlog in one table
	// cannot spend the run's time before the next gets a batch.
	for {
		busy := false
		for i, t := range cleanupTables {
			r := &reports[i]
			if r.Done || r.Err != nil {
				continue
			}
			if ctx.Err() != nil {
				break
			}
			args := []any{interval(retention), o.Batch}
			if t.anyAge {
				args = args[1:]
			}
			more, err := db.cleanupBatch(ctx, q(t.query), args, o, r)
			if err != nil {
				r.Err = err
				continue
			}
			busy = busy || more
		}
		if !busy || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(o.Pause):
		}
	}
	var errs []error
	for i := range reports {
		r := &reports[i]
		if !r.Done && r.Err == nil {
			r.Err = fmt.Errorf("%s: rows left at the run's end: %w", r.Table, ctx.Err())
		}
		errs = append(errs, r.Err)
	}
	return reports, errors.Join(errs...)
}

// trimProcessed deletes terminal processed_events older than retention
// in batches, at most CleanupBatchesMax of them. (Days past retention are
// dropped whole by MaintainPartitions; this trims the rows written before
// partitioning and those in the default partition.)
func (db *DB) trimProcessed(ctx context.Context, retention time.Duration, o CleanupOptions) (int64, error) {
	o, err := o.withDefaults()
	if err != nil {
		return 0, err
	}
	r := CleanupReport{Table: cleanupProcessed}
	for range CleanupBatchesMax {
		more, err := db.cleanupBatch(ctx, q("cleanup_processed"), []any{interval(retention), o.Batch}, o, &r)
		if err != nil || !more {
			return r.Deleted, err
		}
		select {
		case <-ctx.Done():
			return r.Deleted, ctx.Err()
		case <-time.After(o.Pause):
		}
	}
	return r.Deleted, nil
}

// cleanupBatch runs one batch of the delete stmt (its arguments args) in
// its own transaction under o.BatchTimeout, adds it to r, and says
// whether the batch was full (more may be left).
func (db *DB) cleanupBatch(ctx context.Context, stmt query, args []any, o CleanupOptions, r *CleanupReport) (bool, error) {
	// The server's statement_timeout ends a batch first (the connection
	// stays good); the client's bound only when the server is silent.
	bctx, cancel := context.WithTimeout(ctx, o.BatchTimeout+time.Second)
	defer cancel()
	var rows int64
	err := pgx.BeginTxFunc(bctx, db.pool, bounded(pgx.TxOptions{}), func(tx pgx.Tx) error {
		if _, err := tx.Exec(bctx, q("cleanup_batch_timeout").text, durationSetting(o.BatchTimeout)); err != nil {
			return err
		}
		tag, err := tx.Exec(bctx, stmt.text, args...)
		rows = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s: %w", r.Table, classify(stmt.name, err))
	}
	r.Deleted += rows
	r.Batches++
	if o.Deleted != nil {
		o.Deleted(r.Table, rows)
	}
	if rows < int64(o.Batch) {
		r.Done = true
		return false, nil
	}
	return true, nil
}
