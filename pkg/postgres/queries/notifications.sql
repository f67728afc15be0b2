-- name: notifications_claim
-- Take due notifications and push their next attempt out by the lease, so
-- another deliverer skips them while this one sends; a deliverer that dies
-- mid-send leaves them due again when the lease ends. The lease's end
-- (next_attempt_at, returned) is the claim's token: every later claim,
-- record or redelivery moves it, so a run paused past its lease finds
-- the row no longer its own.
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
RETURNING n.id, n.delivery_id, n.kind, n.payload::text, n.attempts, n.trace_id, n.event_id, n.user_id, n.next_attempt_at;

-- name: notifications_release
-- Claimed notifications the deliverer never posted (its run was stopped,
-- or too little of its deadline or lease was left): due again now, and
-- the attempt their claim counted given back. Only rows still under this
-- run's claim ($2: each claim's lease end): a run paused past its lease
-- must not make due, nor refund, a claim another run now holds.
UPDATE notification_outbox n
SET next_attempt_at = now(), attempts = n.attempts - 1
FROM unnest($1::bigint[], $2::timestamptz[]) AS c(id, claimed_until)
WHERE n.id = c.id AND n.next_attempt_at = c.claimed_until AND n.status = 'pending' AND n.attempts > 0;

-- name: notifications_due
-- Whether a delivery run would find anything: a read on the partial
-- index of pending rows, asked before the scheduler claims the period.
SELECT EXISTS (SELECT 1 FROM notification_outbox WHERE status = 'pending' AND next_attempt_at <= now());

-- name: notification_delivered
-- A 2xx from the receiver, and the attempt into the delivery log (logged
-- even when the lease ran out and the row moved on: it did happen). Not
-- bound to the claim: the receiver has the delivery id, so marking it
-- delivered over a newer claim only spares that run's result a retry.
WITH attempt AS (
    INSERT INTO notification_deliveries (notification_id, attempted_at, duration_ms, http_status, error_class)
    VALUES ($1, $2::timestamptz, $3::integer, $4::integer, $5::text)
)
UPDATE notification_outbox
SET status = 'delivered', delivered_at = now(), last_error = NULL
WHERE id = $1 AND status = 'pending';

-- name: notification_failed
-- A failed attempt: retry after $7, or give up for good when $8; the
-- attempt is logged always, the row moved only while still under this
-- run's claim ($9, its lease end): a run paused past its lease must not
-- reschedule (a second POST beside the new claim's) or fail (losing the
-- new claim's delivered mark) a row another run holds.
WITH attempt AS (
    INSERT INTO notification_deliveries (notification_id, attempted_at, duration_ms, http_status, error_class)
    VALUES ($1, $2::timestamptz, $3::integer, $4::integer, $5::text)
)
UPDATE notification_outbox
SET last_error = $6, next_attempt_at = now() + $7::interval,
    status = CASE WHEN $8 THEN 'failed' ELSE status END
WHERE id = $1 AND status = 'pending' AND next_attempt_at = $9::timestamptz;

-- name: notifications_list
-- Newest first, optionally by status, before id $2 (0: from the newest);
-- each with its last $4 attempts, newest first.
SELECT n.id, n.delivery_id, n.event_id, n.user_id, n.kind, n.status, n.attempts, n.next_attempt_at,
       COALESCE(n.last_error, ''), n.created_at, n.delivered_at, n.redeliveries,
       COALESCE(n.redelivery_requested_by, ''), n.redelivery_requested_at,
       COALESCE((
           SELECT json_agg(json_build_object(
                      'at', d.attempted_at, 'duration_ms', d.duration_ms,
                      'http_status', d.http_status, 'error_class', d.error_class) ORDER BY d.id DESC)
           FROM (SELECT * FROM notification_deliveries d
                 WHERE d.notification_id = n.id
                 ORDER BY d.id DESC LIMIT $4) d
       ), '[]')::text
FROM notification_outbox n
WHERE ($1::text = 'all' OR n.status = $1::text) AND ($2::bigint = 0 OR n.id < $2::bigint)
ORDER BY n.id DESC
LIMIT $3;

-- name: notification_redeliver
-- An operator asks for one notification to be sent again: a settled one
-- (delivered or failed) becomes due now with a fresh attempt budget; a
-- pending one is already on its way and is left alone, so asking twice
-- sends it once. Who and when are kept.
WITH target AS (
    SELECT id, status FROM notification_outbox WHERE id = $1 FOR UPDATE
), moved AS (
    UPDATE notification_outbox n
    SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
        redeliveries = n.redeliveries + 1, redelivery_requested_by = $2, redelivery_requested_at = now()
    FROM target
    WHERE n.id = target.id AND target.status <> 'pending'
    RETURNING n.id
)
SELECT target.status, EXISTS (SELECT 1 FROM moved) FROM target;

-- name: notifications_redeliver_failed
-- An operator asks for the failed notifications to be sent again (a
-- receiver was down longer than the attempts last): up to $1 of them,
-- oldest first, become due now with a fresh attempt budget, as one
-- redelivery each. Rows another redelivery holds are skipped; more says
-- whether failed rows remain, so a caller asks again until none do.
WITH target AS (
    SELECT id FROM notification_outbox WHERE status = 'failed' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE notification_outbox n
    SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
        redeliveries = n.redeliveries + 1, redelivery_requested_by = $2, redelivery_requested_at = now()
    FROM target
    WHERE n.id = target.id
    RETURNING n.id
)
SELECT (SELECT count(*) FROM moved),
       EXISTS (SELECT 1 FROM notification_outbox WHERE status = 'failed' AND id NOT IN (SELECT id FROM moved));
