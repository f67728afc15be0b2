package postgres

import (
	"context"
	"time"
)

// RunStats describes the events whose ids start with a prefix (a load run).
type RunStats struct {
	Accepted, Terminal          int
	FirstAccepted, LastTerminal time.Time
	LatencyMillis               map[string]float64
	Outcomes                    map[string]int64
}

// RunStats reads a load run's progress and latencies.
func (db *DB) RunStats(ctx context.Context, prefix string) (RunStats, error) {
	stmt := q("run_stats")
	var s RunStats
	var p50, p95, p99, worst float64
	if err := db.pool.QueryRow(ctx, stmt.text, prefix).Scan(&s.Accepted, &s.Terminal, &s.FirstAccepted, &s.LastTerminal, &p50, &p95, &p99, &worst); err != nil {
		return s, classify(stmt.name, err)
	}
	s.LatencyMillis = map[string]float64{"p50": p50, "p95": p95, "p99": p99, "max": worst}
	stmt = q("run_outcomes")
	rows, err := db.pool.Query(ctx, stmt.text, prefix)
	if err != nil {
		return s, classify(stmt.name, err)
	}
	defer rows.Close()
	s.Outcomes = map[string]int64{}
	for rows.Next() {
		var outcome string
		var n int64
		if err := rows.Scan(&outcome, &n); err != nil {
			return s, classify(stmt.name, err)
		}
		s.Outcomes[outcome] = n
	}
	return s, classify(stmt.name, rows.Err())
}
