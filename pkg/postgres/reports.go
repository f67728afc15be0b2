package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RecordReports notes that reporter (a provider's name) reported the
// transfers of events; a report already noted keeps its first time.
func (db *DB) RecordReports(ctx context.Context, reporter string, events []string) error {
	if len(events) == 0 {
		return nil
	}
	stmt := q("record_reports")
	_, err := db.pool.Exec(ctx, stmt.text, reporter, events)
	return classify(stmt.name, err)
}

// Report is one provider's first report of an event's transfer.
type Report struct {
	Reporter string
	FirstAt  time.Time
}

// EventReports lists who reported an event's transfer, first first.
func (db *DB) EventReports(ctx context.Context, eventID string) ([]Report, error) {
	stmt := q("event_reports")
	rows, err := db.pool.Query(ctx, stmt.text, eventID)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Report, error) {
		var r Report
		return r, row.Scan(&r.Reporter, &r.FirstAt)
	})
	return out, classify(stmt.name, err)
}

// ProviderMiss is how many of the sampled transfer deposits a provider
// never reported.
type ProviderMiss struct {
	Reporter string
	Missed   int64
	Sampled  int64
}

// ProviderMisses samples the newest scanned events (at most scanned of
// them) for transfer deposits older than grace, per provider that
// reported any of them.
func (db *DB) ProviderMisses(ctx context.Context, scanned int, grace time.Duration) ([]ProviderMiss, error) {
	stmt := q("provider_misses")
	rows, err := db.pool.Query(ctx, stmt.text, scanned, interval(grace))
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ProviderMiss, error) {
		var m ProviderMiss
		return m, row.Scan(&m.Reporter, &m.Missed, &m.Sampled)
	})
	return out, classify(stmt.name, err)
}
