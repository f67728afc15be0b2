package postgres

import (
	"context"

	"github.com/settle/settle/pkg/payment"
)

// InsertEventsTogether runs events, distinct ids, through one
// insert_events transaction as one group-commit batch would, handing
// them off in tasks of taskMax (0: none); a test cannot otherwise be
// sure which events the engine batches together.
func (db *DB) InsertEventsTogether(ctx context.Context, events []NewEvent, taskMax int) (inserted []bool, claimed []Claimed, err error) {
	batch := make([]*ingestRequest, len(events))
	for i, e := range events {
		if e.Source == "" {
			e.Source = SourcePayments
		}
		batch[i] = &ingestRequest{Item: ingestItem{event: e, hash: e.Event.Content().Hash()}, Ctx: ctx}
	}
	results, claimed, err := db.insertEvents(ctx, batch, taskMax)
	if err != nil {
		return nil, claimed, err
	}
	inserted = make([]bool, len(results))
	for i, r := range results {
		if r.err != nil {
			return nil, claimed, r.err
		}
		inserted[i] = r.inserted
	}
	return inserted, claimed, nil
}

// InsertableStatus reports whether the query checker lets an insert
// declare status s.
func InsertableStatus(s payment.Status) bool { return insertableStatuses[s] }

// ForceStatsFlush has the backend of the pool's connection flush its
// table counters when it next goes idle (pg_stat_force_next_flush);
// with a pool of one connection, that is the backend of the last
// statement.
func (db *DB) ForceStatsFlush(ctx context.Context) error {
	_, err := db.pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	return err
}
