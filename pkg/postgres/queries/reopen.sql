-- name: reopen_deposit
-- transition: failed -> pending
-- A failed deposit whose transaction the chain (or its provider) shows
-- again goes back to the outbox under a new generation, as a first
-- attempt: its chain history is forgotten and its finality clock starts
-- again at reopened_at. Only the outcomes the caller names reopen, and
-- only a deposit that names a transaction (without one, nothing on the
-- chain can change its fate). $3 says why, shown while it waits; the
-- credit clears it.
WITH reopened AS (
    UPDATE payment_events
    SET status = 'pending', outcome = NULL, error = NULLIF($3, ''), retry_count = 0, generation = generation + 1,
        next_check_at = NULL, receipt_seen_at = NULL, chain_state = NULL, check_count = 0,
        block_number = NULL, block_hash = NULL, absent_since = NULL, absent_head = NULL,
        reopened_at = now(), updated_at = now()
    WHERE event_id = $1 AND status = 'failed' COLLATE "C" AND outcome = ANY($2::text[])
      AND event_type IN ('deposit', 'airdrop') AND tx_hash IS NOT NULL
    RETURNING event_id, event_type
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM reopened
)
SELECT event_id, event_type FROM reopened, (SELECT count(*) FROM wake) w;

-- name: reopen_outcome
-- The reopened deposit's idempotency record says 'reopened', which the
-- ledger takes for a first attempt. The caller holds the event's row lock
-- (its UPDATE above), so nobody writes the key meanwhile. A record the
-- daily cleanup already dropped is written afresh.
WITH updated AS (
    UPDATE processed_events
    SET outcome = 'reopened', updated_at = now()
    WHERE idempotency_key = $1
    RETURNING 1
)
INSERT INTO processed_events (idempotency_key, event_id, outcome)
SELECT $1, $2, 'reopened'
WHERE NOT EXISTS (SELECT 1 FROM updated)
  AND NOT EXISTS (SELECT 1 FROM processed_events WHERE idempotency_key = $1);

-- name: hurry_finality_check
-- Provider evidence against a deposit that waits for finality (Alchemy's
-- removed: true) where the chain can be asked: ask it now rather than at
-- the scheduled time. The answer is the event's state as it was, whether
-- or not it waited.
WITH hurried AS (
    UPDATE payment_events
    SET next_check_at = now(), updated_at = now()
    WHERE event_id = $1 AND status = 'awaiting_finality' COLLATE "C"
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM hurried
)
SELECT e.event_type, e.status, COALESCE(e.chain_state, ''), (SELECT count(*) FROM hurried) > 0, (SELECT count(*) FROM wake)
FROM payment_events e
WHERE e.event_id = $1;

-- name: supersede_target
-- The stored deposit a conflicting transfer report may supersede, locked
-- so that the ledger, a recheck or another report cannot move it between
-- the decision and the write.
SELECT event_type, status, COALESCE(outcome, ''), user_id, asset, amount::text, COALESCE(to_address, ''), source,
       content_hash, COALESCE(tx_hash, ''), COALESCE(transfer_index, ''), COALESCE(network, '')
FROM payment_events
WHERE event_id = $1
FOR UPDATE;

-- name: supersede_deposit
-- transition: failed -> pending
-- A transfer-identity deposit that ended failed/mismatch (the chain
-- contradicted its content; no money moved) takes the content of a new
-- report of the same transfer and is reopened as reopen_deposit does.
-- The guards repeat the caller's decision: nothing but a failed/mismatch
-- deposit of this very transfer is ever overwritten.
WITH superseded AS (
    UPDATE payment_events
    SET user_id = $2, asset = $3, amount = $4::numeric, to_address = $5, content_hash = $6, source = $7, trace_id = $8,
        status = 'pending', outcome = NULL, error = NULLIF($9, ''), retry_count = 0, generation = generation + 1,
        next_check_at = NULL, receipt_seen_at = NULL, chain_state = NULL, check_count = 0,
        block_number = NULL, block_hash = NULL, absent_since = NULL, absent_head = NULL,
        reopened_at = now(), updated_at = now()
    WHERE event_id = $1 AND status = 'failed' COLLATE "C" AND outcome = 'mismatch' AND event_type = 'deposit'
      AND event_id LIKE 'chain:%' AND tx_hash = $10 AND transfer_index = $11 AND network = $12 AND content_hash <> $6
      AND EXISTS (SELECT 1 FROM users WHERE id = $2) AND EXISTS (SELECT 1 FROM assets WHERE code = $3)
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM superseded
)
SELECT event_id FROM superseded, (SELECT count(*) FROM wake) w;
