package postgres

import (
	"context"
	"time"
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
