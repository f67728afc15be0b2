-- name: stale_enqueued
-- Events handed to the queue longer ago than the stale bound: the queue
-- may have lost them. Not locked: recovery asks the queue about them
-- before it writes, and every write is guarded by the generation read
-- here, so two schedulers never recover one twice. One page after the
-- cursor ($3, $4: the last page's last updated_at and event_id): an
-- event left alone (its task still waiting) keeps its updated_at, so
-- without the cursor the same oldest page came back every time.
-- updated_at >= $3 lets the partial index on updated_at find the page.
SELECT event_id, event_type, user_id, asset, amount::text, trace_id, retry_count, generation, updated_at,
       COALESCE(task_id, '')
FROM payment_events
WHERE status = 'enqueued' AND updated_at < now() - $1::interval
  AND updated_at >= $3 AND (updated_at, event_id) > ($3::timestamptz, $4::text)
ORDER BY updated_at, event_id
LIMIT $2;

-- name: requeue_stale
-- transition: enqueued -> pending
-- Back to the outbox under a new generation, so the task the enqueuer
-- creates has a new task id and any old task still around is stale.
UPDATE payment_events
SET status = 'pending', retry_count = retry_count + 1, generation = generation + 1, updated_at = now()
WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
RETURNING event_id;

-- name: fail_stale
-- transition: enqueued -> failed
UPDATE payment_events
SET status = 'failed', outcome = 'dead_lettered', error = $3, retry_count = retry_count + 1, updated_at = now()
WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
RETURNING event_id;
