-- name: notifications_claim
-- Take due notifications and push their next attempt out by the lease, so
-- another deliverer skips them while this one sends; a deliverer that dies
-- mid-send leaves them due again when the lease ends.
WITH due AS (
    SELECT id FROM notification_outbox
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE notification_outbox n
SET next_attempt_at = now() + $2::interval, attempts = n.attempts + 1
FROM due
WHERE n.id = due.id
RETURNING n.id, n.delivery_id, n.kind, n.payload::text, n.attempts, n.trace_id, n.event_id, n.user_id;

-- name: notification_delivered
UPDATE notification_outbox
SET status = 'delivered', delivered_at = now(), last_error = NULL
WHERE id = $1 AND status = 'pending';

-- name: notification_failed
UPDATE notification_outbox
SET last_error = $2, next_attempt_at = now() + $3::interval,
    status = CASE WHEN $4 THEN 'failed' ELSE status END
WHERE id = $1 AND status = 'pending';
