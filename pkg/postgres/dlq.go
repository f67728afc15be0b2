package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
)

// FailToDLQ ends the live task's event as failed/dead_lettered and writes
// its DLQ row, in one transaction. If the event is no longer the task's to
// fail (another generation, or already terminal) nothing is written and
// moved is false: the event is not failed, so there is nothing for a human.
func (db *DB) FailToDLQ(ctx context.Context, letter payment.DeadLetter) (moved bool, id int64, err error) {
	tx, err := db.begin(ctx)
	if err != nil {
		return false, 0, classify("fail to dlq", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	movedIDs, _, err := transition(ctx, tx, q("fail_to_dlq"), nil, nil, letter.EventID, letter.Generation, letter.Error)
	if err != nil {
		return false, 0, err
	}
	if !movedIDs[letter.EventID] {
		return false, 0, nil
	}
	ids, err := insertDeadLetters(ctx, tx, []payment.DeadLetter{letter})
	if err != nil {
		return false, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, 0, classify("fail to dlq commit", err)
	}
	if len(ids) == 0 { // its key names a row already there
		return true, 0, nil
	}
	return true, ids[0], nil
}

// InsertDeadLetters writes DLQ rows that fail no event: tasks that name no
// stored event, entries drained back from the Redis fallback.
func (db *DB) InsertDeadLetters(ctx context.Context, letters []payment.DeadLetter) ([]int64, error) {
	return insertDeadLetters(ctx, db.pool, letters)
}

func insertDeadLetters(ctx context.Context, qr querier, letters []payment.DeadLetter) ([]int64, error) {
	if len(letters) == 0 {
		return nil, nil
	}
	batch := &pgx.Batch{}
	queueDeadLetters(batch, letters)
	stmt := q("insert_dlq")
	rows, err := qr.Query(ctx, batch.QueuedQueries[0].SQL, batch.QueuedQueries[0].Arguments...)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	ids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
		var id int64
		var key string
		return id, row.Scan(&id, &key)
	})
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	fresh := 0
	for _, l := range letters {
		if l.FallbackID == "" {
			fresh++
		}
	}
	// Entries with a fallback id may already be stored; the others must
	// all have been written.
	if len(ids) < fresh || len(ids) > len(letters) {
		return nil, fmt.Errorf("%s: wrote %d of %d rows", stmt.name, len(ids), len(letters))
	}
	return ids, nil
}

// deadLetterIDs reads insert_dlq's answer as one id per letter, in the
// letters' order: 0 for a letter whose key names a row already there
// (ON CONFLICT returns nothing for it, so the ids cannot be read by
// position). Letters without a key are never skipped and keep their order.
func deadLetterIDs(rows pgx.Rows, letters []payment.DeadLetter) ([]int64, error) {
	out := make([]int64, len(letters))
	byKey := make(map[string]int, len(letters))
	var keyless []int
	for i, l := range letters {
		if l.FallbackID == "" {
			keyless = append(keyless, i)
		} else if _, seen := byKey[l.FallbackID]; !seen {
			// ON CONFLICT keeps the first of a key in one call.
			byKey[l.FallbackID] = i
		}
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var key string
		if err := rows.Scan(&id, &key); err != nil {
			return nil, err
		}
		i, ok := byKey[key]
		if key == "" {
			if len(keyless) == 0 {
				return nil, fmt.Errorf("insert_dlq returned more rows than letters")
			}
			i, ok, keyless = keyless[0], true, keyless[1:]
		}
		if !ok {
			return nil, fmt.Errorf("insert_dlq returned key %q of no letter", key)
		}
		out[i] = id
	}
	return out, rows.Err()
}
