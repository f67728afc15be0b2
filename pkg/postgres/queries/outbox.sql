-- name: claim_outbox
-- transition: pending, awaiting_finality -> enqueued
-- The enqueuer's claim: the oldest pending events and the waiting deposits
-- whose re-check is due, skipping rows another scheduler holds. One
-- statement moves the whole batch, so one bad row cannot be half-moved;
-- should the statement itself fail, ClaimOutbox retries row by row in
-- savepoints so that one bad row cannot block the rest. The claim is cut
-- into tasks of at most $3 events (by user, then id) and every row keeps
-- the id of its task: c<claim number>-<chunk>.
-- The waiting deposits due go network by network in turns (each one's
-- longest due, then each one's next, up to $2): a network whose RPC is
-- down keeps many due, every one asked in vain, and in one queue in due
-- order they held another network's deposits back for as long as it took
-- to ask about all of them. The networks are found one index probe each
-- (payment_events_awaiting_network, the next network after the last);
-- up to $2 rows of each are locked, those left out are freed at commit.
WITH RECURSIVE pending AS (
    SELECT event_id, user_id FROM payment_events
    WHERE status = 'pending'
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), waiting_networks AS (
    (SELECT COALESCE(network, '') AS network FROM payment_events
     WHERE status = 'awaiting_finality'
     ORDER BY COALESCE(network, '')
     LIMIT 1)
    UNION ALL
    SELECT n.network
    FROM waiting_networks w
    CROSS JOIN LATERAL (
        SELECT COALESCE(p.network, '') AS network FROM payment_events p
        WHERE p.status = 'awaiting_finality' AND COALESCE(p.network, '') > w.network
        ORDER BY COALESCE(p.network, '')
        LIMIT 1
    ) n
), due AS (
    SELECT d.event_id, d.user_id
    FROM waiting_networks w
    CROSS JOIN LATERAL (
        SELECT l.event_id, l.user_id, l.next_check_at, row_number() OVER (ORDER BY l.next_check_at) AS turn
        FROM (SELECT p.event_id, p.user_id, p.next_check_at FROM payment_events p
              WHERE p.status = 'awaiting_finality' AND COALESCE(p.network, '') = w.network AND p.next_check_at <= now()
              ORDER BY p.next_check_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED) l
    ) d
    ORDER BY d.turn, d.next_check_at
    LIMIT $2
), claim AS (
    SELECT event_id, row_number() OVER (ORDER BY user_id, event_id) - 1 AS n
    FROM (SELECT event_id, user_id FROM pending UNION ALL SELECT event_id, user_id FROM due) c
), claim_no AS (
    SELECT nextval('settle_claim_seq') AS no
)
UPDATE payment_events p
SET status = 'enqueued', next_check_at = NULL, updated_at = now(),
    task_id = 'c' || claim_no.no || '-' || (claim.n / $3)
FROM claim, claim_no
WHERE p.event_id = claim.event_id
RETURNING p.event_id, p.event_type, p.user_id, p.asset, p.amount::text, COALESCE(p.tx_hash, ''),
          p.trace_id, p.generation, p.created_at, p.task_id, COALESCE(p.traceparent, '');

-- name: hot_path_plans
-- The statements of the hot path (ingest, claim, ledger) find a handful
-- of rows by key, whatever the size of the tables: the right plan is
-- always index lookups in nested loops. Planning them afresh for every
-- execution cost as much CPU as running them, and a generic plan made
-- while a table was small could scan it for the life of the connection.
-- So, for the transaction only: one generic plan per prepared statement,
-- made with sequential and bitmap scans, hash and merge joins priced out.
-- It also keeps the claim on a plain scan of the pending index in
-- created_at order, which marks the dead entries it meets (rows claimed
-- before) so later scans skip them; a bitmap scan marks nothing and
-- revisits their heap pages every claim until vacuum runs.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true);

-- name: outbox_candidates
-- The row-by-row fallback: lock the batch, then move each in a savepoint.
-- The due deposits are chosen as claim_outbox chooses them.
WITH RECURSIVE pending AS (
    SELECT event_id FROM payment_events
    WHERE status = 'pending'
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), waiting_networks AS (
    (SELECT COALESCE(network, '') AS network FROM payment_events
     WHERE status = 'awaiting_finality'
     ORDER BY COALESCE(network, '')
     LIMIT 1)
    UNION ALL
    SELECT n.network
    FROM waiting_networks w
    CROSS JOIN LATERAL (
        SELECT COALESCE(p.network, '') AS network FROM payment_events p
        WHERE p.status = 'awaiting_finality' AND COALESCE(p.network, '') > w.network
        ORDER BY COALESCE(p.network, '')
        LIMIT 1
    ) n
), due AS (
    SELECT d.event_id, d.user_id
    FROM waiting_networks w
    CROSS JOIN LATERAL (
        SELECT l.event_id, l.user_id, l.next_check_at, row_number() OVER (ORDER BY l.next_check_at) AS turn
        FROM (SELECT p.event_id, p.user_id, p.next_check_at FROM payment_events p
              WHERE p.status = 'awaiting_finality' AND COALESCE(p.network, '') = w.network AND p.next_check_at <= now()
              ORDER BY p.next_check_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED) l
    ) d
    ORDER BY d.turn, d.next_check_at
    LIMIT $2
)
SELECT event_id FROM pending UNION ALL SELECT event_id FROM due;

-- name: claim_one
-- transition: pending, awaiting_finality -> enqueued
-- A row claimed alone travels alone, in a task of its own claim number:
-- the id its key derives is taken by an earlier task of the same
-- generation when the deposit was parked for finality (the queue keeps a
-- task's id after it ran, and refuses it again).
UPDATE payment_events
SET status = 'enqueued', next_check_at = NULL, updated_at = now(), task_id = 'c' || nextval('settle_claim_seq') || '-0'
WHERE event_id = $1 AND status COLLATE "C" IN ('pending', 'awaiting_finality')
RETURNING event_id, event_type, user_id, asset, amount::text, COALESCE(tx_hash, ''),
          trace_id, generation, created_at, COALESCE(task_id, ''), COALESCE(traceparent, '');

-- name: release_handed
-- transition: enqueued -> pending
-- The api could not enqueue a task it claimed at ingest: its events go
-- back to the outbox under a new generation (should the task have reached
-- Redis after all, it is then stale) and the enqueuer is woken. Guarded
-- by the task id, so an event the ledger settled meanwhile stays settled.
WITH moved AS (
    UPDATE payment_events
    SET status = 'pending', generation = generation + 1, task_id = NULL, updated_at = now()
    WHERE event_id = ANY($1::text[]) AND status = 'enqueued' COLLATE "C" AND task_id = $2
    RETURNING event_id
), wake AS (
    SELECT pg_notify('settle_outbox', '') WHERE EXISTS (SELECT 1 FROM moved)
)
SELECT event_id, (SELECT count(*) FROM wake) FROM moved;
