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

-- name: lock_credited
-- A deposit about to be compensated or given back, locked so that a
-- compensation and its giving back are decided one at a time.
SELECT event_type, user_id, asset, amount::text, status, COALESCE(tx_hash, ''), trace_id, COALESCE(network, ''),
       COALESCE(chain_state, '')
FROM payment_events
WHERE event_id = $1
FOR UPDATE;

-- name: reorg_cycle_events
-- Which of a deposit's possible compensations and give-backs exist, and
-- their status (by primary key: the ids are derived, at most
-- 2 x ReorgCyclesMax of them).
SELECT event_id, status, COALESCE(outcome, '') FROM payment_events WHERE event_id = ANY($1::text[]);

-- name: reopen_give_back
-- transition: failed -> pending
-- A give-back voided before it was credited (its transfer left the chain
-- again at once) goes back to the outbox when the transfer is back: the
-- same id, a new generation, a first attempt for the ledger
-- (reopen_outcome). $2 says why.
WITH reopened AS (
    UPDATE payment_events
    SET status = 'pending', outcome = NULL, error = NULLIF($2, ''), retry_count = 0, generation = generation + 1,
        chain_state = NULL, next_check_at = NULL, reopened_at = now(), updated_at = now()
    WHERE event_id = $1 AND status = 'failed' COLLATE "C" AND outcome = 'reorged' AND event_type = 'deposit'
      AND tx_hash IS NULL AND event_id LIKE 'return:%'
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM reopened
)
SELECT event_id FROM reopened, (SELECT count(*) FROM wake) w;

-- name: reopen_compensation
-- transition: failed -> pending
-- A compensation cancelled because its transfer came back before it was
-- applied goes back to the outbox when the transfer leaves again: the
-- same id, a new generation, a first attempt for the ledger
-- (reopen_outcome). $2 says why.
WITH reopened AS (
    UPDATE payment_events
    SET status = 'pending', outcome = NULL, error = NULLIF($2, ''), retry_count = 0, generation = generation + 1,
        chain_state = NULL, next_check_at = NULL, reopened_at = now(), updated_at = now()
    WHERE event_id = $1 AND status = 'failed' COLLATE "C" AND outcome = 'reorged' AND event_type = 'reorg_compensation'
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM reopened
)
SELECT event_id FROM reopened, (SELECT count(*) FROM wake) w;

-- name: cancel_dead_lettered
-- A reorg event the ledger dead-lettered that the chain has made moot: a
-- compensation (the user's available balance did not cover it) whose
-- transfer is on the chain again, or a give-back whose transfer left it
-- again. Nothing is owed any more, so it ends reorged, which no replay
-- reopens. The caller holds its row lock. $2 says why.
UPDATE payment_events
SET outcome = 'reorged', error = NULLIF($2, ''), updated_at = now()
WHERE event_id = $1 AND status = 'failed' COLLATE "C" AND outcome = 'dead_lettered'
  AND (event_type = 'reorg_compensation' OR event_type = 'deposit' AND tx_hash IS NULL AND event_id LIKE 'return:%');

-- name: watch_returned
-- A compensated deposit whose transfer is reported on the chain again is
-- watched again from the block it was seen in; once that transfer's
-- block is finalized, the deposit is given back (mark_final).
UPDATE payment_events
SET chain_state = 'watching', absent_since = NULL, absent_head = NULL, error = NULLIF($2, ''), updated_at = now()
WHERE event_id = $1 AND status = 'confirmed' COLLATE "C" AND chain_state = 'reorged' COLLATE "C";

-- name: mark_given_back
-- The deposit's compensation is reversed by a give-back credit: it is on
-- the chain again ($2: 'final' when its block is, NULL where the
-- provider's word is the evidence and there is nothing to watch).
UPDATE payment_events
SET chain_state = $2, absent_since = NULL, absent_head = NULL, error = NULLIF($3, ''), updated_at = now()
WHERE event_id = $1;

-- name: lock_compensated
-- lock_credited, for a credited deposit compensated for a reorg only: any
-- other row is neither locked nor waited for, so a scan pass that meets
-- deposits the webhooks reported first costs one index probe each.
SELECT event_type, user_id, asset, amount::text, status, COALESCE(tx_hash, ''), trace_id, COALESCE(network, ''),
       COALESCE(chain_state, '')
FROM payment_events
WHERE event_id = $1 AND status = 'confirmed' COLLATE "C" AND chain_state = 'reorged' COLLATE "C"
FOR UPDATE;

-- name: lock_compensated_claims_of_tx
-- lock_compensated_claim for every claim on a transaction ($1, $2),
-- whatever its index (a transaction mined again in another block gives
-- its logs other indexes), at most $3, in id order so two reports lock
-- them in the same order.
SELECT p.event_id, p.event_type, p.user_id, p.asset, p.amount::text, p.status, COALESCE(p.tx_hash, ''), p.trace_id,
       COALESCE(p.network, ''), COALESCE(p.chain_state, '')
FROM chain_transfers c
JOIN payment_events p ON p.event_id = c.event_id
WHERE c.network = $1 AND c.tx_hash = $2
  AND p.status = 'confirmed' COLLATE "C" AND p.chain_state = 'reorged' COLLATE "C"
ORDER BY p.event_id
LIMIT $3
FOR UPDATE OF p;

-- name: lock_compensated_claim
-- lock_compensated, for the deposit that holds a transfer's claim when it
-- is credited and compensated: a report or scan of the transfer under
-- another id (the scanner's chain: id of a deposit /webhook/payments
-- named) finds it here.
SELECT p.event_id, p.event_type, p.user_id, p.asset, p.amount::text, p.status, COALESCE(p.tx_hash, ''), p.trace_id,
       COALESCE(p.network, ''), COALESCE(p.chain_state, '')
FROM chain_transfers c
JOIN payment_events p ON p.event_id = c.event_id
WHERE c.network = $1 AND c.tx_hash = $2 AND c.transfer_index = $3
  AND p.status = 'confirmed' COLLATE "C" AND p.chain_state = 'reorged' COLLATE "C"
FOR UPDATE OF p;
