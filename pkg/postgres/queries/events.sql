-- name: insert_event
-- One statement, so one round trip and an atomic commit: the row and the
-- wake-up of the enqueuer commit together or not at all. The subqueries
-- run on the statement's snapshot, so existing_hash never sees the row
-- this statement inserts; a row committed by a racing insert after the
-- snapshot shows up as "nothing inserted, nothing found", and the caller
-- runs the statement again.
WITH ins AS (
    INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, tx_hash, content_hash, trace_id, source, to_address, related_event_id, transfer_index,
                                hold_id, network, traceparent)
    SELECT $1, $2, $3, $4, $5::numeric, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15
    WHERE EXISTS (SELECT 1 FROM users WHERE id = $3)
      AND EXISTS (SELECT 1 FROM assets WHERE code = $4)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') FROM ins
)
SELECT
    -- wake has one row per inserted row; counting it runs pg_notify.
    (SELECT count(*) FROM wake) AS inserted,
    (SELECT content_hash FROM payment_events WHERE event_id = $1) AS existing_hash,
    EXISTS (SELECT 1 FROM users WHERE id = $3) AS user_exists,
    EXISTS (SELECT 1 FROM assets WHERE code = $4) AS asset_exists;

-- name: get_event
SELECT event_id, event_type, user_id, asset, amount::text, status, retry_count, generation,
       COALESCE(tx_hash, ''), trace_id, source, COALESCE(related_event_id, ''),
       COALESCE(outcome, ''), COALESCE(error, ''), COALESCE(chain_state, ''),
       block_number, next_check_at, check_count, created_at, updated_at
FROM payment_events
WHERE event_id = $1;

-- name: event_states
-- The actual state of events a transition did not move, for the caller to
-- classify.
SELECT event_id, status, generation, COALESCE(outcome, '')
FROM payment_events
WHERE event_id = ANY($1::text[]);

-- name: insert_events
-- The batched insert_event: many webhooks' events in one statement and
-- one commit (group commit). Rows come with their position n; ids are
-- distinct within a batch (the batcher folds duplicates).
--
-- $16 is the hand-off's task size. Zero: the rows are inserted 'pending'
-- and one pg_notify wakes the enqueuer for the whole batch. Above zero the
-- api hands the batch to the queue itself: the rows are inserted
-- 'enqueued' under tasks of at most $16 events, cut as claim_outbox cuts
-- a claim (one claim number per statement, chunks in (user_id, event_id)
-- order), and the statement returns what the enqueue needs. Writing the
-- status in the insert, rather than updating the rows after it, leaves
-- one tuple version per row: a status update is never HOT (status is in
-- the partial indexes' predicates), so it wrote a new entry into every
-- index, ran the CHECKs and the transition trigger again, and its WAL. The chunks number the rows that pass the
-- users and assets tests, so a conflict can leave a task short of $16;
-- a row that conflicts is never written, so a duplicate of a row the
-- scheduler owns stays the scheduler's. The insert guard (migration
-- 0017) admits 'enqueued' only with a task id.
-- insert status: pending, enqueued
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[]::numeric[], $6::text[], $7::bytea[],
                $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[])
         WITH ORDINALITY AS t(event_id, event_type, user_id, asset, amount, tx_hash, content_hash,
                              trace_id, source, to_address, related_event_id, transfer_index, hold_id, network, traceparent, n)
), claim_no AS MATERIALIZED (
    -- Drawn once, and only for a hand-off.
    SELECT nextval('settle_claim_seq') AS no WHERE $16::integer > 0
), ins AS (
    INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, tx_hash, content_hash, trace_id, source, to_address, related_event_id, transfer_index,
                                hold_id, network, traceparent, status, task_id)
    SELECT i.event_id, i.event_type, i.user_id, i.asset, i.amount, NULLIF(i.tx_hash, ''), i.content_hash,
           i.trace_id, i.source, NULLIF(i.to_address, ''), NULLIF(i.related_event_id, ''), NULLIF(i.transfer_index, ''),
           NULLIF(i.hold_id, ''), NULLIF(i.network, ''), NULLIF(i.traceparent, ''),
           CASE WHEN $16::integer > 0 THEN 'enqueued' ELSE 'pending' END,
           -- NULL without a hand-off (no claim number, no division by 0).
           'c' || (SELECT no FROM claim_no) || '-' || ((row_number() OVER (ORDER BY i.user_id, i.event_id) - 1) / NULLIF($16::integer, 0))
    FROM input i
    WHERE EXISTS (SELECT 1 FROM users u WHERE u.id = i.user_id)
      AND EXISTS (SELECT 1 FROM assets a WHERE a.code = i.asset)
      -- A redelivery never reaches the INSERT: forming its row would
      -- evaluate insert_xid's default, pg_current_xact_id(), and so give a
      -- transaction that writes nothing an xid and a WAL flush at COMMIT.
      -- A row committed after this snapshot still meets ON CONFLICT.
      AND NOT EXISTS (SELECT 1 FROM payment_events e WHERE e.event_id = i.event_id)
    -- Rows (and so their unique-index locks) in id order: two api replicas
    -- inserting the same ids in arrival order would deadlock. Byte order,
    -- whatever the database's collation: the scanner's passes store in it.
    ORDER BY i.event_id COLLATE "C"
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, event_type, user_id, asset, amount, tx_hash, trace_id, generation, created_at, task_id, traceparent
), wake AS (
    SELECT pg_notify('settle_outbox', '') WHERE $16::integer = 0 AND EXISTS (SELECT 1 FROM ins)
)
-- Joins, not EXISTS in the select list: a generic plan may turn such an
-- EXISTS into a hashed subplan that reads every user. The columns after
-- the sixth are NULL but for a row inserted under a task.
SELECT i.n,
       ins.event_id IS NOT NULL,
       p.content_hash,
       u.id IS NOT NULL,
       a.code IS NOT NULL,
       (SELECT count(*) FROM wake),
       ins.event_type, ins.user_id, ins.asset, ins.amount::text, COALESCE(ins.tx_hash, ''),
       ins.trace_id, ins.generation, ins.created_at, ins.task_id, COALESCE(ins.traceparent, '')
FROM input i
LEFT JOIN ins ON ins.event_id = i.event_id
LEFT JOIN payment_events p ON p.event_id = i.event_id
LEFT JOIN users u ON u.id = i.user_id
LEFT JOIN assets a ON a.code = i.asset
ORDER BY i.n;
