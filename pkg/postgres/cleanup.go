package postgres

import (
	"context"
	"fmt"
	"time"
)

// Cleanup bounds of the seed.
const (
	CleanupRetentionDefault = 14 * 24 * time.Hour
	CleanupBatchDefault     = 5000
	CleanupBatchesMax       = 200
	CleanupPauseDefault     = 100 * time.Millisecond
)

// CleanupProcessed deletes terminal processed_events older than retention
// in batches of batch rows, pausing between batches so the cleanup never
// hogs the database, and at most CleanupBatchesMax batches per run. (Days
// past retention are dropped whole by MaintainPartitions; this trims the
// rows written before partitioning and those in the default partition.)
func (db *DB) CleanupProcessed(ctx context.Context, retention time.Duration, batch int, pause time.Duration) (int64, error) {
	return db.deleteInBatches(ctx, q("cleanup_processed"), retention, batch, pause)
}

// CleanupNotifications deletes settled notifications older than retention,
// in bounded batches.
func (db *DB) CleanupNotifications(ctx context.Context, retention time.Duration, batch int, pause time.Duration) (int64, error) {
	return db.deleteInBatches(ctx, q("cleanup_notifications"), retention, batch, pause)
}

// deleteInBatches runs a delete statement taking (retention interval,
// batch size) until a batch comes back short, or CleanupBatchesMax batches.
func (db *DB) deleteInBatches(ctx context.Context, stmt query, retention time.Duration, batch int, pause time.Duration) (int64, error) {
	if batch <= 0 || batch > CleanupBatchDefault*10 {
		return 0, fmt.Errorf("cleanup batch %d outside 1..%d", batch, CleanupBatchDefault*10)
	}
	interval := fmt.Sprintf("%d seconds", int64(retention.Seconds()))
	var total int64
	for range CleanupBatchesMax {
		tag, err := db.pool.Exec(ctx, stmt.text, interval, batch)
		if err != nil {
			return total, classify(stmt.name, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
	return total, nil
}
