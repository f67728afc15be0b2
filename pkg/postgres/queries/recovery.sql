-- name: stale_enqueued
-- Events handed to the queue longer ago than the stale bound: the queue
-- may have lost them. Not locked: recovery asks the queue about them
-- before it writes, and every write is guarded by the generation read
-- here, so two schedulers never recover one twice.
SELECT event_id, event_type, user_id, asset, amount::text, trace_id, retry_count, generation, updated_at,
       COALESCE(task_id, '')
FROM payment_events
WHERE status = 'enqueued' AND updated_at < now() - $1::interval
ORDER BY updated_at
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
