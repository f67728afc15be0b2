package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// QueryText is a named statement's SQL, for tests that EXPLAIN it.
func QueryText(name string) string { return q(name).text }

// CustomPlans sums custom_plans of the prepared statements of every
// connection the pool holds whose text contains fragment.
func (db *DB) CustomPlans(ctx context.Context, fragment string) (int64, error) {
	conns := db.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var total int64
	for _, c := range conns {
		var n int64
		if err := c.QueryRow(ctx, `SELECT coalesce(sum(custom_plans), 0) FROM pg_prepared_statements WHERE statement LIKE '%' || $1 || '%'`, fragment).Scan(&n); err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// ListenWithin is Listen with its connect, statement and quiet bounds.
func ListenWithin(ctx context.Context, dsn, channel string, wake func(), onError func(error), connect, call, quiet time.Duration) {
	listen(ctx, dsn, channel, wake, onError, listenBounds{connect: connect, call: call, quiet: quiet})
}

// ClaimRowByRow is ClaimOutbox's fallback, run on its own.
func (db *DB) ClaimRowByRow(ctx context.Context, pendingMax, dueMax int) ([]Claimed, error) {
	return db.claimRowByRow(ctx, pendingMax, dueMax)
}

// InsertDeadLettersByLetter runs insert_dlq and reads its answer as the
// ledger does: one id per letter, 0 for one ON CONFLICT skipped.
func (db *DB) InsertDeadLettersByLetter(ctx context.Context, letters []payment.DeadLetter) ([]int64, error) {
	batch := &pgx.Batch{}
	queueDeadLetters(batch, letters)
	rows, err := db.pool.Query(ctx, batch.QueuedQueries[0].SQL, batch.QueuedQueries[0].Arguments...)
	if err != nil {
		return nil, err
	}
	return deadLetterIDs(rows, letters)
}

// SetMigrationLockQuery replaces one try for the migration lock until the
// returned function restores it.
func SetMigrationLockQuery(query string) (restore func()) {
	old := migrationLockQuery
	migrationLockQuery = query
	return func() { migrationLockQuery = old }
}

// SetTxIdleMax replaces how long a transaction may wait for its client
// until the returned function restores it.
func SetTxIdleMax(d time.Duration) (restore func()) {
	old := txIdleMax
	txIdleMax = d
	return func() { txIdleMax = old }
}

// InPass is the scan pass's transaction with the guard given.
func (db *DB) InPass(ctx context.Context, events []NewEvent, guard func(pgx.Tx) (bool, error)) ([]StoredDeposit, error) {
	return db.inPass(ctx, events, guard)
}
