-- One on-chain transfer credits at most once, whatever ids its reporters
-- use. A credited deposit with a transaction claims its transfer here, in
-- the ledger transaction that credits it: (network, tx_hash,
-- transfer_index) where the index is the Transfer log's decimal logIndex,
-- 'native' for the transaction's own value, or 'trace:<traceAddress>' for
-- ETH moved by a contract call.
CREATE TABLE chain_transfers (
    network        text        NOT NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    tx_hash        text        NOT NULL CHECK (tx_hash ~ '^0x[0-9a-f]{64}$'),
    -- 'unresolved:<event_id>' holds a transfer of the transaction that
    -- could not be named: a token deposit credited without asking the
    -- chain (no RPC), or one credited before this table existed. The
    -- ledger counts such rows as claims on that transaction's transfers
    -- of the same asset.
    transfer_index text        NOT NULL CHECK (transfer_index ~ '^([0-9]{1,20}|native|trace:[A-Za-z0-9_]{1,96}|unresolved:.+)$'),
    asset          text        NOT NULL,
    event_id       text        NOT NULL UNIQUE,
    -- A log index counts within its block: mined again in another block
    -- after a reorg, the same transfer has another index. The block the
    -- claim was made in and the log's position within its transaction
    -- let the ledger recognise it there (and move the claim with it).
    block_hash     text        NULL CHECK (block_hash ~ '^0x[0-9a-f]{64}$'),
    log_position   integer     NULL CHECK (log_position >= 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- Checked at the end of each statement, so one UPDATE may move two
    -- claims past each other.
    CONSTRAINT chain_transfers_pkey PRIMARY KEY (network, tx_hash, transfer_index) DEFERRABLE INITIALLY IMMEDIATE
);

-- What a /webhook/payments deposit says it claims (NULL: the first
-- matching transfer of its transaction that nobody holds). When a
-- reopened deposit's finality clock started (NULL: at created_at). Reorg
-- evidence of a credited deposit: when its receipt was first missing and
-- the head then, so a single null or a lagging node is never taken for a
-- reorg.
ALTER TABLE payment_events
    ADD COLUMN transfer_index text NULL CHECK (transfer_index ~ '^([0-9]{1,20}|native|trace:[A-Za-z0-9_]{1,96})$'),
    ADD COLUMN reopened_at    timestamptz NULL,
    ADD COLUMN absent_since   timestamptz NULL,
    ADD COLUMN absent_head    bigint NULL;

-- New outcomes. The old constraints allowed a subset of the new ones, so
-- every existing row satisfies them: NOT VALID skips a scan under lock.
ALTER TABLE payment_events DROP CONSTRAINT payment_events_outcome_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_outcome_check
    CHECK (outcome IN ('success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch',
                       'dead_lettered', 'duplicate_transfer')) NOT VALID;
-- 'reopened': a failed deposit sent back to the ledger (the chain shows
-- its transaction again); the ledger treats it as a first attempt.
ALTER TABLE processed_events DROP CONSTRAINT processed_events_outcome_check;
ALTER TABLE processed_events ADD CONSTRAINT processed_events_outcome_check
    CHECK (outcome IN ('pending', 'success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch',
                       'dead_lettered', 'duplicate_transfer', 'reopened'));

-- Who asked the chain again about a failed deposit, when, and what the
-- chain showed.
CREATE TABLE event_rechecks (
    id           bigserial   PRIMARY KEY,
    event_id     text        NOT NULL,
    requested_by text        NOT NULL,
    chain_state  text        NOT NULL,
    result       text        NOT NULL CHECK (result IN ('reopened', 'unchanged', 'not_applicable')),
    detail       text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_rechecks_event ON event_rechecks (event_id, id);

-- The transfers of deposits credited before this migration. Alchemy ids
-- name their transfer; a native deposit's transfer is the transaction's
-- own value; a token deposit from /webhook/payments did not say which log
-- it was, so it holds an unresolved claim. Earliest credit first: should
-- one transfer already have been credited twice, the later credit is left
-- without a row and `settlectl check` reports it (invariant 5). DISTINCT
-- ON keeps that first credit: ON CONFLICT cannot take the deferrable
-- primary key above as its arbiter.
INSERT INTO chain_transfers (network, tx_hash, transfer_index, asset, event_id, created_at)
SELECT DISTINCT ON (network, tx_hash, transfer_index) network, tx_hash, transfer_index, asset, event_id, credited_at
FROM (
    SELECT CASE WHEN p.event_id LIKE 'alchemy:%' THEN split_part(p.event_id, ':', 2) ELSE a.network END AS network,
           p.tx_hash,
           CASE
               WHEN p.event_id ~ '^alchemy:[A-Z][A-Z0-9_]*:0x[0-9a-f]{64}:external$' THEN 'native'
               WHEN p.event_id ~ '^alchemy:[A-Z][A-Z0-9_]*:0x[0-9a-f]{64}:internal:[A-Za-z0-9_]{1,96}$'
                   THEN 'trace:' || split_part(p.event_id, ':', 5)
               WHEN p.event_id ~ '^alchemy:[A-Z][A-Z0-9_]*:0x[0-9a-f]{64}:token:[0-9]{1,20}$' THEN split_part(p.event_id, ':', 5)
               WHEN a.contract_address IS NULL THEN 'native'
               ELSE 'unresolved:' || p.event_id
           END AS transfer_index,
           p.asset, p.event_id, p.updated_at AS credited_at
    FROM payment_events p
    JOIN assets a ON a.code = p.asset
    WHERE p.status = 'confirmed' AND p.event_type IN ('deposit', 'airdrop') AND p.tx_hash IS NOT NULL
) credited
ORDER BY network, tx_hash, transfer_index, credited_at, event_id;
