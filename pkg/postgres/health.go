package postgres

import (
	"context"
	"fmt"
	"time"
)

// Zombie bounds of the seed.
const (
	ProcessingStuckAfter = 5 * time.Minute
	PendingStuckAfter    = 15 * time.Minute
	PendingKeyStuckAfter = 10 * time.Minute
	DeadLettersHourlyMax = 10
)

// Health is what the zombie check counts.
type Health struct {
	StuckProcessing, StuckPending, StuckEnqueued, StuckAwaiting int64
	DeadLettersLastHour, PendingKeys, OpenDeadLetters           int64
}

func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

// Health counts stuck events and DLQ activity.
func (db *DB) Health(ctx context.Context) (Health, error) {
	stmt := q("zombie_counts")
	var h Health
	err := db.pool.QueryRow(ctx, stmt.text, interval(ProcessingStuckAfter), interval(PendingStuckAfter), interval(PendingKeyStuckAfter)).
		Scan(&h.StuckProcessing, &h.StuckPending, &h.StuckEnqueued, &h.StuckAwaiting, &h.DeadLettersLastHour, &h.PendingKeys, &h.OpenDeadLetters)
	return h, classify(stmt.name, err)
}
