-- name: cleanup_processed
-- One batch of terminal idempotency records past retention. Never a
-- pending one; balance_events keeps its own unique constraint, so a late
-- redelivery still cannot credit twice.
WITH doomed AS (
    SELECT idempotency_key FROM processed_events
    WHERE outcome <> 'pending' AND created_at < now() - $1::interval
    ORDER BY created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM processed_events p
USING doomed
WHERE p.idempotency_key = doomed.idempotency_key;

-- name: cleanup_notifications
-- Delivered (or given up) notifications past retention, one batch.
WITH doomed AS (
    SELECT id FROM notification_outbox
    WHERE status <> 'pending' AND created_at < now() - $1::interval
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM notification_outbox n
USING doomed
WHERE n.id = doomed.id;

-- name: cleanup_rescan_found
-- One batch of the found ids of rescan jobs no longer running, whatever
-- their age. A job's end forgets its ids, but a replica of a binary from
-- before migration 0031 ending a job (a rolling update) leaves them, and
-- rescan_jobs rows are never deleted, so the cascade never runs either.
-- A job never runs again once ended.
WITH doomed AS (
    SELECT f.job_id, f.event_id FROM rescan_found f
    JOIN rescan_jobs j ON j.id = f.job_id
    WHERE j.status <> 'running'
    LIMIT $1
    FOR UPDATE OF f SKIP LOCKED
)
DELETE FROM rescan_found f
USING doomed
WHERE f.job_id = doomed.job_id AND f.event_id = doomed.event_id;

-- name: cleanup_batch_timeout
-- Each batch of the cleanup is its own transaction under this bound, so a
-- batch stuck behind a lock or a slow disk ends, and the run goes on.
SELECT set_config('statement_timeout', $1, true);
