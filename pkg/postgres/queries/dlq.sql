-- name: insert_dlq
-- An entry drained twice from the Redis fallback keeps its first row
-- (fallback_id is unique); such a conflict returns no id, so each id
-- comes with its key for the caller to tell whose it is.
INSERT INTO dead_letter_queue (event_id, event_type, user_id, asset, amount, error, attempt, generation, source, trace_id, payload, created_at, fallback_id)
SELECT t.event_id, t.event_type, NULLIF(t.user_id, 0), NULLIF(t.asset, ''), NULLIF(t.amount, '')::numeric,
       t.error, t.attempt, t.generation, t.source, t.trace_id, NULLIF(t.payload, '')::jsonb, COALESCE(t.created_at, now()),
       NULLIF(t.fallback_id, '')
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::int[], $8::int[],
            $9::text[], $10::text[], $11::text[], $12::timestamptz[], $13::text[])
     WITH ORDINALITY AS t(event_id, event_type, user_id, asset, amount, error, attempt, generation, source, trace_id, payload, created_at, fallback_id, n)
ORDER BY t.n
ON CONFLICT (fallback_id) DO NOTHING
RETURNING id, COALESCE(fallback_id, '');

-- name: fail_to_dlq
-- transition: enqueued -> failed
-- The live task gave up (retries exhausted, or an error no retry can fix):
-- the event fails and its DLQ row is written in the same transaction.
UPDATE payment_events
SET status = 'failed', outcome = 'dead_lettered', error = $3, updated_at = now()
WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
RETURNING event_id;

-- name: dlq_list
SELECT d.id, d.event_id, d.event_type, COALESCE(d.user_id, 0), COALESCE(d.asset, ''), COALESCE(d.amount::text, ''),
       d.error, d.attempt, d.generation, d.source, d.trace_id, d.created_at,
       COALESCE(d.resolution, ''), COALESCE(d.resolved_by, ''), d.resolved_at, COALESCE(d.resolution_reason, ''),
       COALESCE(e.status, ''), COALESCE(d.payload::text, '')
FROM dead_letter_queue d
LEFT JOIN payment_events e ON e.event_id = d.event_id
WHERE ($1 = 'all' OR ($1 = 'open' AND d.resolution IS NULL) OR ($1 = 'resolved' AND d.resolution IS NOT NULL))
  AND d.id > $2
ORDER BY d.id
LIMIT $3;

-- name: dlq_get
SELECT d.id, d.event_id, d.event_type, COALESCE(d.user_id, 0), COALESCE(d.asset, ''), COALESCE(d.amount::text, ''),
       d.error, d.attempt, d.generation, d.source, d.trace_id, d.created_at,
       COALESCE(d.resolution, ''), COALESCE(d.resolved_by, ''), d.resolved_at, COALESCE(d.resolution_reason, ''),
       COALESCE(e.status, ''), COALESCE(d.payload::text, '')
FROM dead_letter_queue d
LEFT JOIN payment_events e ON e.event_id = d.event_id
WHERE d.id = $1;

-- name: dlq_event_of
SELECT event_id FROM dead_letter_queue WHERE id = $1;

-- name: dlq_lock_event
-- An operator's action locks the event before its entry, the order the
-- worker's dead-lettering and settle's cancels take, so actions on one
-- event's entries run one after another.
SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE;

-- name: dlq_lock
SELECT event_id, COALESCE(resolution, ''), generation
FROM dead_letter_queue
WHERE id = $1
FOR UPDATE;

-- name: dlq_failure_discarded
-- An operator discarded the event's current failure (an entry of its
-- generation): no entry of that failure replays it, not even a copy
-- drained from the fallback list after the discard.
SELECT EXISTS (
    SELECT 1 FROM dead_letter_queue d JOIN payment_events e ON e.event_id = d.event_id
    WHERE d.event_id = $1 AND d.resolution = 'discarded' AND d.generation = e.generation
);

-- name: dlq_resolve
UPDATE dead_letter_queue
SET resolution = $2, resolved_by = $3, resolved_at = now(), resolution_reason = NULLIF($4, '')
WHERE id = $1 AND resolution IS NULL;

-- name: dlq_discard_event
-- Every open entry of one event, closed by settle itself ($2) for a
-- reason ($3).
UPDATE dead_letter_queue
SET resolution = 'discarded', resolved_by = $2, resolved_at = now(), resolution_reason = NULLIF($3, '')
WHERE event_id = $1 AND resolution IS NULL;

-- name: dlq_replay_siblings
-- The other open entries of a failure just replayed (the event's, of
-- that generation), closed with it.
UPDATE dead_letter_queue
SET resolution = 'replayed', resolved_by = $3, resolved_at = now(), resolution_reason = $4
WHERE event_id = $1 AND generation = $2 AND resolution IS NULL;

-- name: reopen_for_replay
-- transition: failed -> pending
-- A human replays a dead-lettered event: back to the outbox under a new
-- generation with a fresh recovery budget. Only dead-lettered failures
-- reopen; a business outcome (insufficient funds, reorged) is final.
-- Only the entry of the current generation's failure ($2) reopens it: an
-- older entry's failure was already replayed, and the event failing
-- again since is another failure with an entry of its own.
WITH reopened AS (
    UPDATE payment_events
    SET status = 'pending', outcome = NULL, error = NULL, retry_count = 0, generation = generation + 1,
        next_check_at = NULL, updated_at = now()
    WHERE event_id = $1 AND status = 'failed' AND outcome = 'dead_lettered' AND generation = $2
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM reopened
)
SELECT event_id FROM reopened, (SELECT count(*) FROM wake) w;
