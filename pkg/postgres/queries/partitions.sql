-- name: partition_lock_timeout
-- Every partition DDL runs under a short lock timeout of its own, so
-- waiting for ACCESS EXCLUSIVE never queues the ledger's writes for long.
SELECT set_config('lock_timeout', $1, true);

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
