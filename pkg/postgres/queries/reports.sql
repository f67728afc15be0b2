-- name: record_reports
-- Rows in id order, so two deliveries of one block never deadlock.
INSERT INTO transfer_reports (event_id, reporter)
SELECT id, $1 FROM unnest($2::text[]) AS t(id) ORDER BY id
ON CONFLICT DO NOTHING;

-- name: event_reports
SELECT reporter, first_at FROM transfer_reports WHERE event_id = $1 ORDER BY first_at, reporter;

-- name: provider_misses
-- Among the newest $1 events (read backwards off the paging index, so the
-- read is bounded whatever the table holds), the transfer deposits older
-- than the grace $2 (each provider had that long to report them): how
-- many each provider that reported any of them never reported.
WITH newest AS (
    SELECT event_id, event_type, created_at FROM payment_events
    ORDER BY insert_xid DESC, event_id DESC
    LIMIT $1
), recent AS (
    SELECT event_id FROM newest
    WHERE created_at < now() - $2::interval AND event_type = 'deposit' AND event_id LIKE 'chain:%'
), reporters AS (
    SELECT DISTINCT r.reporter FROM transfer_reports r JOIN recent e ON e.event_id = r.event_id
)
SELECT p.reporter, count(*) FILTER (WHERE r.event_id IS NULL), count(*)
FROM reporters p CROSS JOIN recent e
LEFT JOIN transfer_reports r ON r.event_id = e.event_id AND r.reporter = p.reporter
GROUP BY p.reporter
ORDER BY p.reporter;

-- name: delete_old_reports
-- One bounded batch off the first_at index; the caller repeats it. A row
-- locked meanwhile is passed over, not waited for.
WITH doomed AS (
    SELECT event_id, reporter FROM transfer_reports
    WHERE first_at < now() - $1::interval
    ORDER BY first_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM transfer_reports r
USING doomed
WHERE r.event_id = doomed.event_id AND r.reporter = doomed.reporter;

-- name: sight_transfer
-- A report naming its block; a removal marks the block removed for good,
-- and a report of a block already removed (a stale redelivery) changes
-- nothing.
INSERT INTO transfer_sightings AS s (event_id, block_hash, removed, removed_at, reporter)
VALUES ($1, $2, $3, CASE WHEN $3 THEN now() END, $4)
ON CONFLICT (event_id, block_hash) DO UPDATE SET removed = true, removed_at = now()
WHERE EXCLUDED.removed AND NOT s.removed;

-- name: sighted_on_chain
-- Whether some block the transfer was reported in is not removed.
SELECT EXISTS (SELECT 1 FROM transfer_sightings WHERE event_id = $1 AND NOT removed);

-- name: event_sightings
SELECT block_hash, removed, reporter, first_at, removed_at FROM transfer_sightings
WHERE event_id = $1 ORDER BY first_at, block_hash;

-- name: delete_old_sightings
-- One bounded batch off the first_at index; the caller repeats it. A
-- transfer with a block reported removed keeps all its sightings: without
-- them a stale or replayed add of that block would put it back on the
-- chain. Those are few (one per reorg report) and stay. A row locked
-- meanwhile (a report of its block being written) is passed over, and
-- one that was marked removed before its lock came is kept (NOT
-- s.removed is checked again on the locked row).
WITH doomed AS (
    SELECT s.event_id, s.block_hash FROM transfer_sightings s
    WHERE s.first_at < now() - $1::interval
      AND NOT s.removed
      AND NOT EXISTS (SELECT 1 FROM transfer_sightings r WHERE r.event_id = s.event_id AND r.removed)
    ORDER BY s.first_at
    LIMIT $2
    FOR UPDATE OF s SKIP LOCKED
)
DELETE FROM transfer_sightings t
USING doomed
WHERE t.event_id = doomed.event_id AND t.block_hash = doomed.block_hash;
