-- name: partition_lock_timeout
-- Every partition DDL runs under a short lock timeout of its own, so
-- waiting for ACCESS EXCLUSIVE never queues the ledger's writes for long.
SELECT set_config('lock_timeout', $1, true);

-- name: partition_move_timeout
-- A day's move holds ACCESS EXCLUSIVE on processed_events while it runs:
-- each of its statements is bounded, so the ledger waits at most that.
SELECT set_config('statement_timeout', $1, true);

-- name: partition_move_lock
-- Taken first, so no ledger write lands in the default partition, and no
-- read misses a record, between the move out and the move back in.
LOCK TABLE processed_events IN ACCESS EXCLUSIVE MODE;

-- name: partition_move_stage
CREATE TEMP TABLE processed_events_moving (LIKE processed_events) ON COMMIT DROP;

-- name: partition_move_out
-- One day's records out of the default partition ($1, $2: its bounds).
WITH moved AS (
    DELETE FROM processed_events_default
    WHERE created_at >= $1 AND created_at < $2
    RETURNING idempotency_key, event_id, outcome, created_at, updated_at
)
INSERT INTO processed_events_moving (idempotency_key, event_id, outcome, created_at, updated_at)
SELECT idempotency_key, event_id, outcome, created_at, updated_at FROM moved;

-- name: partition_move_in
-- Run once the day's partition exists: the records land in it, unchanged.
INSERT INTO processed_events (idempotency_key, event_id, outcome, created_at, updated_at)
SELECT idempotency_key, event_id, outcome, created_at, updated_at FROM processed_events_moving;

-- name: partitions_ahead
-- One day's partition ($1 is its midnight, UTC); 1 if it was created.
SELECT settle_processed_partitions_ahead($1, 1);

-- name: processed_partitions
-- processed_events' daily partitions (processed_events_pYYYYMMDD).
SELECT c.relname
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_events'::regclass
  AND c.relname ~ '^processed_events_p[0-9]{8}$'
ORDER BY c.relname;

-- name: partition_has_pending
-- Run with the partition's name substituted as an identifier.
SELECT EXISTS (SELECT 1 FROM %s WHERE outcome = 'pending');

-- name: drop_partition
DROP TABLE IF EXISTS %s;

-- name: default_partition_rows
SELECT count(*) FROM processed_events_default;

-- name: legacy_partition
-- Rows left in the pre-partitioning partition and whether the end of its
-- range has passed (on the database's clock).
SELECT (SELECT count(*) FROM processed_events_legacy),
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz < now()
FROM pg_class c
WHERE c.oid = 'processed_events_legacy'::regclass;
