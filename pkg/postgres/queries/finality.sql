-- name: await_finality
-- transition: enqueued -> awaiting_finality
-- The deposit's transaction has not reached the finality policy: park it
-- until next_check_at, $3 from the database's clock (never the worker's).
-- Waiting burns neither retries nor recoveries.
UPDATE payment_events
SET status = 'awaiting_finality', next_check_at = now() + $3::interval, check_count = check_count + 1,
    receipt_seen_at = CASE WHEN $4 THEN COALESCE(receipt_seen_at, now()) ELSE receipt_seen_at END,
    -- A receipt seen by this check (it names its block): an absence
    -- recorded before was a lagging node.
    absent_since = CASE WHEN $6::text IS NULL THEN absent_since END,
    absent_head = CASE WHEN $6::text IS NULL THEN absent_head END,
    block_number = COALESCE($5, block_number), block_hash = COALESCE($6, block_hash),
    error = NULLIF($7, ''), updated_at = now()
WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
RETURNING event_id;

-- name: decide_chain_outcome
-- transition: enqueued -> failed
-- The chain decided against the deposit: reverted, mismatched, reorged or
-- never found in time. A business outcome, not a DLQ case.
UPDATE payment_events
SET status = 'failed', outcome = $3, error = $4, next_check_at = NULL, updated_at = now(),
    chain_state = CASE WHEN $3 = 'reorged' THEN 'reorged' ELSE chain_state END
WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
RETURNING event_id, receipt_seen_at IS NOT NULL;

-- name: chain_wait_state
-- The age is taken on the database's clock, like created_at itself; a
-- reopened deposit's finality clock starts at its reopening.
SELECT receipt_seen_at IS NOT NULL, created_at,
       (extract(epoch FROM now() - COALESCE(reopened_at, created_at)) * 1000000)::bigint, check_count, COALESCE(to_address, ''),
       COALESCE(transfer_index, ''),
       -- Rows from before networks existed are their asset's network's.
       COALESCE(network, (SELECT a.network FROM assets a WHERE a.code = payment_events.asset)),
       COALESCE(block_number, 0), COALESCE(block_hash, '')
FROM payment_events
WHERE event_id = $1;

-- name: record_wait_absence
-- As record_absence, for a deposit still waiting for finality (the live
-- task: $2 its generation) whose receipt is missing while the chain shows
-- nothing else: seen before in block $3, or never seen ($3 null, past
-- FINALITY_TIMEOUT: not_found needs the same two reads as reorged). $4
-- the head seen, $5 REORG_RECHECK_DELAY. A receipt seen (again)
-- (await_finality with a block) or a credit (ledger_confirm) forgets it.
WITH prev AS (
    SELECT event_id, absent_since, absent_head
    FROM payment_events
    WHERE event_id = $1 AND status = 'enqueued' COLLATE "C" AND generation = $2
      AND (block_hash = $3::text OR ($3::text IS NULL AND block_hash IS NULL AND receipt_seen_at IS NULL))
    FOR UPDATE
)
UPDATE payment_events p
SET absent_since = COALESCE(prev.absent_since, now()), absent_head = COALESCE(prev.absent_head, $4::bigint),
    updated_at = now()
FROM prev
WHERE p.event_id = prev.event_id
RETURNING prev.absent_since IS NULL,
          (extract(epoch FROM now() - COALESCE(prev.absent_since, now())) * 1000000)::bigint,
          COALESCE(prev.absent_head, $4::bigint),
          COALESCE(now() - prev.absent_since >= $5::interval AND $4::bigint > prev.absent_head, false);

-- name: watched_deposits
-- Credited deposits (and settled posts: their payouts) whose block was
-- not final when they were confirmed, with what they claim (amount,
-- recipient, transfer), which a transaction mined again elsewhere must
-- still pay: the $2 longest unwatched of each network in $1, so that one
-- network (down, or many rows) never takes another's turn. A post's log
-- position is its payout claim's 'log:<n>' (n counts within the
-- transaction).
SELECT w.event_id, w.user_id, w.asset, w.tx_hash, w.block_number, w.block_hash, w.trace_id, n.network,
       w.amount, w.to_address, w.transfer_index,
       CASE WHEN w.event_type = 'withdrawal_post'
            THEN (SELECT substr(p.transfer, 5)::bigint FROM payout_transfers p WHERE p.event_id = w.event_id AND p.transfer LIKE 'log:%')
            ELSE (SELECT c.log_position FROM chain_transfers c WHERE c.event_id = w.event_id) END,
       w.event_type, w.hold_id
FROM unnest($1::text[]) AS n(network)
CROSS JOIN LATERAL (
    SELECT event_id, user_id, asset, COALESCE(tx_hash, '') AS tx_hash, COALESCE(block_number, 0) AS block_number,
           COALESCE(block_hash, '') AS block_hash, trace_id, amount::text AS amount,
           COALESCE(to_address, '') AS to_address, COALESCE(transfer_index, '') AS transfer_index,
           event_type, COALESCE(hold_id, '') AS hold_id
    FROM payment_events
    WHERE chain_state = 'watching'
      AND COALESCE(network, (SELECT a.network FROM assets a WHERE a.code = payment_events.asset)) = n.network
    ORDER BY updated_at
    LIMIT $2
) AS w;

-- name: mark_final
UPDATE payment_events
SET chain_state = 'final', absent_since = NULL, absent_head = NULL, updated_at = now()
WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C";

-- name: mark_payout_reorged
-- A watched post whose payout transaction left the chain (seen in block
-- $2): it stops being watched, with chain_state 'reorged' and why ($3);
-- absent_since/absent_head stay as the absence evidence, if any. Its
-- status, outcome, debit and hold stay as they are: what the funds need
-- is an operator's decision. Guarded like move_evidence.
UPDATE payment_events
SET chain_state = 'reorged', error = $3, updated_at = now()
WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C" AND block_hash = $2
  AND event_type = 'withdrawal_post'
RETURNING event_id;

-- name: touch_watched
-- To the back of the watch list, whatever the chain said (or could not).
UPDATE payment_events
SET updated_at = now()
WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C";

-- name: keep_watching
-- Seen canonical where the evidence says: any absence recorded before was
-- a lagging node, not the first of two reads.
UPDATE payment_events
SET absent_since = NULL, absent_head = NULL, updated_at = now()
WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C";

-- name: move_evidence
-- The transaction is canonical in another block ($3, $4): the evidence
-- follows it there, and the deposit stops being watched if that block is
-- final ($5). Guarded by the block it was seen in ($2), so a pass that
-- raced another changes nothing.
UPDATE payment_events
SET block_number = $3, block_hash = $4, absent_since = NULL, absent_head = NULL,
    chain_state = CASE WHEN $5::boolean THEN 'final' ELSE chain_state END, updated_at = now()
WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C" AND block_hash = $2
RETURNING event_id;

-- name: record_absence
-- The receipt is missing and nothing else shows a reorg. The first
-- absence stamps the database's clock and the head seen ($3); a later one
-- is evidence only once $4 (REORG_RECHECK_DELAY) has passed on the
-- database's clock and the head is past the one seen then. Guarded by the
-- block it was seen in ($2). Answers: first absence, time since the
-- first, the head then, evidence.
WITH prev AS (
    SELECT event_id, absent_since, absent_head
    FROM payment_events
    WHERE event_id = $1 AND chain_state = 'watching' COLLATE "C" AND block_hash = $2
    FOR UPDATE
)
UPDATE payment_events p
SET absent_since = COALESCE(prev.absent_since, now()), absent_head = COALESCE(prev.absent_head, $3::bigint),
    updated_at = now()
FROM prev
WHERE p.event_id = prev.event_id
RETURNING prev.absent_since IS NULL,
          (extract(epoch FROM now() - COALESCE(prev.absent_since, now())) * 1000000)::bigint,
          COALESCE(prev.absent_head, $3::bigint),
          COALESCE(now() - prev.absent_since >= $4::interval AND $3::bigint > prev.absent_head, false);
