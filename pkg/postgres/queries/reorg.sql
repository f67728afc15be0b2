-- name: lock_event
SELECT event_id, event_type, user_id, asset, amount::text, status, COALESCE(tx_hash, ''), trace_id, generation,
       COALESCE(network, '')
FROM payment_events
WHERE event_id = $1
FOR UPDATE;

-- name: void_uncredited
-- transition: pending, enqueued, awaiting_finality -> failed
-- A deposit whose transaction left the chain before it was credited.
UPDATE payment_events
SET status = 'failed', outcome = 'reorged', error = $2, chain_state = 'reorged', next_check_at = NULL, updated_at = now()
WHERE event_id = $1 AND status COLLATE "C" IN ('pending', 'enqueued', 'awaiting_finality')
RETURNING event_id;

-- name: record_outcome
-- The idempotency record of an event decided outside the ledger batch;
-- the caller holds the event's row lock, so nobody writes the key meanwhile.
WITH updated AS (
    UPDATE processed_events
    SET outcome = $3, updated_at = now()
    WHERE idempotency_key = $1 AND outcome IN ('pending', 'dead_lettered')
    RETURNING 1
)
INSERT INTO processed_events (idempotency_key, event_id, outcome)
SELECT $1, $2, $3
WHERE NOT EXISTS (SELECT 1 FROM updated)
  AND NOT EXISTS (SELECT 1 FROM processed_events WHERE idempotency_key = $1);

-- name: mark_reorged
UPDATE payment_events
SET chain_state = 'reorged', error = $2, updated_at = now()
WHERE event_id = $1;
