-- name: claim_outbox
-- transition: pending, awaiting_finality -> enqueued
-- The enqueuer's claim: the oldest pending events and the waiting deposits
-- whose re-check is due, skipping rows another scheduler holds. One
-- statement moves the whole batch, so one bad row cannot be half-moved;
-- should the statement itself fail, ClaimOutbox retries row by row in
-- savepoints so that one bad row cannot block the rest.
WITH pending AS (
    SELECT event_id FROM payment_events
    WHERE status = 'pending'
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT event_id FROM payment_events
    WHERE status = 'awaiting_finality' AND next_check_at <= now()
    ORDER BY next_check_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claim AS (
    SELECT event_id FROM pending UNION ALL SELECT event_id FROM due
)
UPDATE payment_events p
SET status = 'enqueued', next_check_at = NULL, updated_at = now()
FROM claim
WHERE p.event_id = claim.event_id
RETURNING p.event_id, p.event_type, p.user_id, p.asset, p.amount::text, COALESCE(p.tx_hash, ''),
          p.trace_id, p.generation, p.created_at;

-- name: outbox_candidates
-- The row-by-row fallback: lock the batch, then move each in a savepoint.
WITH pending AS (
    SELECT event_id FROM payment_events
    WHERE status = 'pending'
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT event_id FROM payment_events
    WHERE status = 'awaiting_finality' AND next_check_at <= now()
    ORDER BY next_check_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
SELECT event_id FROM pending UNION ALL SELECT event_id FROM due;

-- name: claim_one
-- transition: pending, awaiting_finality -> enqueued
UPDATE payment_events
SET status = 'enqueued', next_check_at = NULL, updated_at = now()
WHERE event_id = $1 AND status IN ('pending', 'awaiting_finality')
RETURNING event_id, event_type, user_id, asset, amount::text, COALESCE(tx_hash, ''),
          trace_id, generation, created_at;
