package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ClaimPeriod reports whether this replica (owner) runs job for period:
// exactly one replica wins each period, however many race for it.
func (db *DB) ClaimPeriod(ctx context.Context, job string, period int64, owner string) (bool, error) {
	stmt := q("claim_period")
	var got string
	err := db.pool.QueryRow(ctx, stmt.text, job, period, owner).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, classify(stmt.name, err)
	}
	return true, nil
}
