-- The ledger transaction, step by step (ledger.go runs them in order).
-- Locks are always taken in the same global order: balances rows sorted by
-- (user_id, asset) first, then event rows (the hold events pulled in for
-- posts after them, never waiting: SKIP LOCKED), then the transfer locks of
-- their transactions (hash order), then the holds rows that posts and
-- voids resolve (hold_id order), then idempotency keys sorted. Two batches
-- touching the same users therefore queue behind each other instead of
-- deadlocking.

-- name: ledger_ensure_balances
-- Balance rows are created lazily, in lock order, for known users and
-- assets only; an unknown user or asset simply gets no row.
INSERT INTO balances (user_id, asset)
SELECT t.user_id, t.asset
FROM unnest($1::bigint[], $2::text[]) AS t(user_id, asset)
WHERE EXISTS (SELECT 1 FROM users u WHERE u.id = t.user_id)
  AND EXISTS (SELECT 1 FROM assets a WHERE a.code = t.asset)
ORDER BY t.user_id, t.asset
ON CONFLICT (user_id, asset) DO NOTHING;

-- name: ledger_lock_balances
-- LockRows sits above the Sort, so rows are locked in (user_id, asset)
-- order. Waiting is bounded by lock_timeout, after which the batch fails
-- as retryable (55P03).
SELECT b.user_id, b.asset, b.balance::text, b.held::text
FROM balances b
JOIN unnest($1::bigint[], $2::text[]) AS t(user_id, asset)
  ON b.user_id = t.user_id AND b.asset = t.asset
ORDER BY b.user_id, b.asset
FOR UPDATE OF b;

-- name: ledger_claim
-- Lock the events this batch applies: only the live generation's task may
-- apply an event, and only if it describes the stored row exactly; the
-- values that move money are the row's. The rows stay 'enqueued' until
-- the batch's final transition, in the same transaction, so nobody ever
-- sees an intermediate status; the lock keeps everyone else out meanwhile.
-- event_id = ANY keeps the plan on the primary key whatever the backlog.
SELECT p.event_id, p.generation, p.event_type, p.user_id, p.asset, p.amount::text, p.trace_id,
       COALESCE(p.related_event_id, ''), p.created_at,
       COALESCE(p.tx_hash, ''), COALESCE(p.transfer_index, ''), COALESCE(p.network, a.network),
       COALESCE(p.hold_id, ''), COALESCE(p.network, a.network), COALESCE(p.to_address, '')
FROM payment_events p
JOIN unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[]::numeric[], $7::text[])
     AS t(event_id, generation, event_type, user_id, asset, amount, tx_hash)
  ON p.event_id = t.event_id
-- An event's network is its own; rows from before networks existed name
-- none, and theirs is their asset's (the legacy columns of assets).
JOIN assets a ON a.code = p.asset
WHERE p.event_id = ANY($1::text[]) AND p.status = 'enqueued' COLLATE "C" AND p.generation = t.generation
  AND p.event_type = t.event_type AND p.user_id = t.user_id AND p.asset = t.asset AND p.amount = t.amount
  -- The transfer locks are taken for the tasks' transactions.
  AND COALESCE(p.tx_hash, '') = t.tx_hash
ORDER BY p.event_id
FOR UPDATE OF p;

-- name: ledger_pull_holds
-- The withdrawal_hold events that this batch's posts and voids name and
-- that wait unapplied in the queue (enqueued at their first generation,
-- so no idempotency record exists) with no task in this batch: the batch
-- applies them before their posts instead of the posts waiting for them
-- (ledger.Snapshot.Pulled); their own tasks later find them terminal.
-- Only holds of an account of the posts' tasks, whose balance row this
-- batch holds: everyone who applies a hold locks that row first. Locked
-- after the batch's own events, out of event order: SKIP LOCKED never
-- waits, and a hold someone else holds is left to them (its post waits
-- for it as before).
SELECT p.event_id, p.generation, p.event_type, p.user_id, p.asset, p.amount::text, p.trace_id,
       COALESCE(p.related_event_id, ''), p.created_at,
       COALESCE(p.tx_hash, ''), COALESCE(p.transfer_index, ''), COALESCE(p.network, a.network),
       COALESCE(p.hold_id, ''), COALESCE(p.network, a.network), COALESCE(p.to_address, '')
FROM payment_events p
JOIN assets a ON a.code = p.asset
WHERE p.event_id = ANY (ARRAY(SELECT r.hold_id FROM payment_events r
                              WHERE r.event_id = ANY($1::text[]) AND r.hold_id IS NOT NULL))
  AND p.event_type = 'withdrawal_hold' AND p.status = 'enqueued' COLLATE "C" AND p.generation = 0
  AND p.event_id <> ALL ($4::text[])
  AND (p.user_id, p.asset) IN (SELECT t.user_id, t.asset FROM unnest($2::bigint[], $3::text[]) AS t(user_id, asset))
ORDER BY p.event_id
FOR UPDATE OF p SKIP LOCKED;

-- name: ledger_lock_transfers
-- Deposits with a transaction claim a transfer in chain_transfers, posts
-- checked on the chain one in payout_transfers. The
-- transaction-scoped lock per transaction hash (taken after the balances
-- and events, in hash order) makes the claims of two batches on one
-- transaction queue: the second reads the first's committed claims
-- instead of racing it to the unique index.
SELECT pg_advisory_xact_lock(1397, s.k)
FROM (SELECT DISTINCT hashtext(h) AS k FROM unnest($1::text[]) AS h ORDER BY 1) s;

-- name: ledger_transfer_claims
SELECT network, tx_hash, transfer_index, asset, event_id, COALESCE(block_hash, ''), COALESCE(log_position, -1)
FROM chain_transfers
WHERE tx_hash = ANY($1::text[]);

-- name: ledger_payout_claims
-- The transfers already settling posts, on the posts' transactions (read
-- under the same transfer locks).
SELECT network, tx_hash, transfer, event_id
FROM payout_transfers
WHERE tx_hash = ANY($1::text[]);

-- name: ledger_claim_payouts
-- A violation here means the plan missed a claim: it aborts the batch.
INSERT INTO payout_transfers (network, tx_hash, transfer, transfer_index, block_hash, asset, event_id)
SELECT t.network, t.tx_hash, t.transfer, t.transfer_index, t.block_hash, t.asset, t.event_id
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
     AS t(network, tx_hash, transfer, transfer_index, block_hash, asset, event_id);

-- name: ledger_move_claims
-- Claims whose transaction is now mined in another block take the log
-- index their transfer has there.
UPDATE chain_transfers c
SET transfer_index = t.transfer_index, block_hash = t.block_hash
FROM unnest($1::text[], $2::text[], $3::text[]) AS t(event_id, transfer_index, block_hash)
WHERE c.event_id = t.event_id;

-- name: ledger_claim_transfers
-- A violation here means the plan missed a claim: it aborts the batch.
INSERT INTO chain_transfers (network, tx_hash, transfer_index, asset, event_id, block_hash, log_position)
SELECT t.network, t.tx_hash, t.transfer_index, t.asset, t.event_id, NULLIF(t.block_hash, ''), NULLIF(t.log_position, -1)
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[])
     AS t(network, tx_hash, transfer_index, asset, event_id, block_hash, log_position);

-- name: ledger_hold_events
-- The withdrawal_hold events behind the holds that this batch's posts and
-- voids name, read before the holds rows: a hold whose event is not yet
-- terminal has no row yet, and its post waits for it. Read first, a hold
-- event seen confirmed always comes with its row below.
SELECT e.event_id, e.status
FROM payment_events e
WHERE e.event_id = ANY (ARRAY(SELECT p.hold_id FROM payment_events p
                              WHERE p.event_id = ANY($1::text[]) AND p.hold_id IS NOT NULL))
  AND e.event_type = 'withdrawal_hold';

-- name: ledger_lock_holds
-- The holds that this batch's posts and voids resolve (their hold_id as
-- stored, the events being locked), locked in hold_id order after the
-- balances and the events. A post by another user than the hold's does
-- not hold the owner's balance row, and never moves its money.
SELECT h.hold_id, h.user_id, h.asset, h.amount::text, h.status, h.network, COALESCE(h.to_address, '')
FROM holds h
WHERE h.hold_id = ANY (ARRAY(SELECT p.hold_id FROM payment_events p
                             WHERE p.event_id = ANY($1::text[]) AND p.hold_id IS NOT NULL))
ORDER BY h.hold_id
FOR UPDATE OF h;

-- name: ledger_key_outcomes
-- Idempotency keys already recorded: their events take the replay path.
SELECT idempotency_key, outcome
FROM processed_events
WHERE idempotency_key = ANY($1::text[]);

-- name: ledger_update_balances
-- Deltas, not absolute values: the CHECKs (balance >= 0, 0 <= held <=
-- balance) are the last guard should the arithmetic above ever be wrong.
UPDATE balances b
SET balance = b.balance + t.delta::numeric, held = b.held + t.held_delta::numeric, updated_at = now()
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS t(user_id, asset, delta, held_delta)
WHERE b.user_id = ANY($1::bigint[]) AND b.user_id = t.user_id AND b.asset = t.asset;

-- name: ledger_open_holds
-- Holds reserved by this batch; the hold id is the hold event's id, which
-- this transaction holds locked, so a conflict here is a planning error
-- and aborts the batch.
INSERT INTO holds (hold_id, user_id, asset, amount, network, to_address)
SELECT t.hold_id, t.user_id, t.asset, t.amount::numeric, t.network, NULLIF(t.to_address, '')
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[])
     AS t(hold_id, user_id, asset, amount, network, to_address)
ORDER BY t.hold_id;

-- name: ledger_resolve_holds
-- hold transition: open -> posted
-- hold transition: open -> voided
-- Only an open hold resolves, and every planned one must: a shortfall
-- aborts the transaction.
WITH moved AS (
    UPDATE holds h
    SET status = t.status, resolved_at = now(), resolved_by = t.resolved_by
    FROM unnest($1::text[], $2::text[], $3::text[]) AS t(hold_id, status, resolved_by)
    WHERE h.hold_id = ANY($1::text[]) AND h.hold_id = t.hold_id AND h.status = 'open'
    RETURNING h.hold_id
)
SELECT settle_assert(count(*) = cardinality($1::text[]), 'ledger_resolve_holds moved ' || count(*) || ' of ' || cardinality($1::text[]))
FROM moved;

-- name: ledger_insert_journal
INSERT INTO balance_events (user_id, asset, amount, event_type, source_event_id, network)
SELECT t.user_id, t.asset, t.amount::numeric, t.event_type, t.source_event_id, NULLIF(t.network, '')
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
     AS t(user_id, asset, amount, event_type, source_event_id, network);

-- name: ledger_record_keys
-- The idempotency records of first-time events, written once with their
-- final outcome, in key order. processed_events is partitioned by day, so
-- the key alone cannot be declared unique; the event row lock this
-- transaction holds keeps a second writer out, and the journal's unique
-- constraint is the guard behind it.
INSERT INTO processed_events (idempotency_key, event_id, outcome)
SELECT t.idempotency_key, t.event_id, t.outcome
FROM unnest($1::text[], $2::text[], $3::text[]) AS t(idempotency_key, event_id, outcome)
ORDER BY t.idempotency_key;

-- name: ledger_update_keys
-- Records of events run again as first attempts: a replayed dead letter,
-- or a deposit reopened because the chain shows its transaction again.
UPDATE processed_events p
SET outcome = t.outcome, updated_at = now()
FROM unnest($1::text[], $2::text[]) AS t(idempotency_key, outcome)
WHERE p.idempotency_key = ANY($1::text[]) AND p.idempotency_key = t.idempotency_key
  AND p.outcome IN ('dead_lettered', 'reopened');

-- name: ledger_confirm
-- transition: enqueued -> confirmed
-- Pipelined ahead of COMMIT, so it asserts that every claimed row moved:
-- a shortfall aborts the transaction instead of committing half a batch.
WITH moved AS (
    UPDATE payment_events p
    SET status = 'confirmed', outcome = t.outcome, error = NULL, retry_count = 0, updated_at = now(),
        block_number = COALESCE(t.block_number, p.block_number),
        block_hash = COALESCE(NULLIF(t.block_hash, ''), p.block_hash),
        chain_state = NULLIF(t.chain_state, ''),
        -- Credited on a receipt: an absence noted while it waited is not
        -- the reorg watcher's first read.
        absent_since = NULL, absent_head = NULL
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[]) AS t(event_id, block_number, block_hash, chain_state, outcome)
    WHERE p.event_id = ANY($1::text[]) AND p.event_id = t.event_id AND p.status = 'enqueued' COLLATE "C"
    RETURNING p.event_id
)
SELECT settle_assert(count(*) = cardinality($1::text[]), 'ledger_confirm moved ' || count(*) || ' of ' || cardinality($1::text[]))
FROM moved;

-- name: ledger_fail
-- transition: enqueued -> failed
WITH moved AS (
    UPDATE payment_events p
    SET status = 'failed', outcome = t.outcome, error = NULLIF(t.error, ''), updated_at = now()
    FROM unnest($1::text[], $2::text[], $3::text[]) AS t(event_id, outcome, error)
    WHERE p.event_id = ANY($1::text[]) AND p.event_id = t.event_id AND p.status = 'enqueued' COLLATE "C"
    RETURNING p.event_id
)
SELECT settle_assert(count(*) = cardinality($1::text[]), 'ledger_fail moved ' || count(*) || ' of ' || cardinality($1::text[]))
FROM moved;

-- name: insert_notifications
-- delivery_id is unique: however often an event is delivered, it yields
-- one notification.
INSERT INTO notification_outbox (delivery_id, event_id, user_id, kind, payload, trace_id)
SELECT t.delivery_id, t.event_id, t.user_id, t.kind, t.payload::jsonb, t.trace_id
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[])
     AS t(delivery_id, event_id, user_id, kind, payload, trace_id)
ON CONFLICT (delivery_id) DO NOTHING;

-- name: ledger_content_matches
-- The events whose stored content is the task's: a task the claim did not
-- lock although its event is enqueued at its generation either raced a
-- concurrent attempt (same content: retry) or names another event.
SELECT p.event_id
FROM payment_events p
JOIN unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[]::numeric[], $6::text[])
     AS t(event_id, event_type, user_id, asset, amount, tx_hash)
  ON p.event_id = t.event_id
WHERE p.event_id = ANY($1::text[])
  AND p.event_type = t.event_type AND p.user_id = t.user_id AND p.asset = t.asset AND p.amount = t.amount
  AND COALESCE(p.tx_hash, '') = t.tx_hash;
