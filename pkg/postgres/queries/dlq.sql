-- name: insert_dlq
-- An entry drained twice from the Redis fallback keeps its first row
-- (fallback_id is unique); such a conflict returns no id.
INSERT INTO dead_letter_queue (event_id, event_type, user_id, asset, amount, error, attempt, generation, source, trace_id, payload, created_at, fallback_id)
SELECT t.event_id, t.event_type, NULLIF(t.user_id, 0), NULLIF(t.asset, ''), NULLIF(t.amount, '')::numeric,
       t.error, t.attempt, t.generation, t.source, t.trace_id, NULLIF(t.payload, '')::jsonb, COALESCE(t.created_at, now()),
       NULLIF(t.fallback_id, '')
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::int[], $8::int[],
            $9::text[], $10::text[], $11::text[], $12::timestamptz[], $13::text[])
     WITH ORDINALITY AS t(event_id, event_type, user_id, asset, amount, error, attempt, generation, source, trace_id, payload, created_at, fallback_id, n)
ORDER BY t.n
ON CONFLICT (fallback_id) DO NOTHING
RETURNING id;

-- name: fail_to_dlq
-- transition: enqueued -> failed
-- The live task gave up (retries exhausted, or an error no retry can fix):
-- the event fails and its DLQ row is written in the same transaction.
UPDATE payment_events
SET status = 'failed', outcome = 'dead_lettered', error = $3, updated_at = now()
WHERE event_id = $1 AND status = 'enqueued' AND generation = $2
RETURNING event_id;
