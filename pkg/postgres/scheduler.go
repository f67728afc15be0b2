package postgres

import (
	"context"
	"fmt"
	"time"
)

// ClaimPeriod claims job's current period for this replica (owner): the
// period of length every that starts at a multiple of every since the
// epoch plus at, on the database's clock. It returns that period's start
// and whether this replica won it: exactly one replica wins each period,
// however many race for it, and a replica's own clock plays no part.
func (db *DB) ClaimPeriod(ctx context.Context, job string, every, at time.Duration, owner string) (time.Time, bool, error) {
	stmt := q("claim_period")
	if every < time.Microsecond || at < 0 || at >= every {
		return time.Time{}, false, fmt.Errorf("%s %s: period %s at %s: want a period of at least 1µs and 0 <= at < period", stmt.name, job, every, at)
	}
	var start time.Time
	var won bool
	err := db.pool.QueryRow(ctx, stmt.text, job, every.Microseconds(), at.Microseconds(), owner).Scan(&start, &won)
	if err != nil {
		return time.Time{}, false, classify(stmt.name, err)
	}
	return start, won, nil
}
