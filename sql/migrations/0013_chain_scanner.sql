-- The chain scanner: deposits no webhook reported. CONTRACT.md, "Chain
-- scanner: deposits that no webhook reported".

-- One row per network the scanner follows: the next block a pass reads.
-- A pass claims the row by lease (lease_owner, lease_until), reads the
-- chain with no transaction open, then stores its events and moves
-- next_block in one transaction guarded by the next_block it read.
-- lease_to_block is the last block of the latest claimed range: a
-- backfill resolves its end from it (see rescan_jobs.to_block).
CREATE TABLE chain_cursors (
    network        text        PRIMARY KEY CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    next_block     bigint      NOT NULL CHECK (next_block >= 0),
    lease_owner    text        NULL,
    lease_until    timestamptz NULL,
    lease_to_block bigint      NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- The block a deposit address was said to receive from (backfill).
-- Nullable without a default: metadata only, no rewrite.
ALTER TABLE deposit_addresses ADD COLUMN from_block bigint NULL CHECK (from_block >= 0);

-- Rescans (POST /admin/rescan: every address of the network) and
-- backfills (POST /admin/deposit-addresses with from_block: one address),
-- scanned by the scheduler in bounded passes from next_block through
-- to_block, claimed by lease like the cursors. A backfill's to_block is
-- NULL until the scheduler resolves it to the last block the cursor's
-- passes may have scanned without the address (next_block - 1, or the
-- range a pass holds): from there on the cursor sees it.
CREATE TABLE rescan_jobs (
    id           text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    network      text        NOT NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    -- NULL: every registered address of the network.
    address      text        NULL CHECK (address ~ '^0x[0-9a-f]{40}$'),
    from_block   bigint      NOT NULL CHECK (from_block >= 0),
    to_block     bigint      NOT NULL,
    end_pending  boolean     NOT NULL DEFAULT false,
    next_block   bigint      NOT NULL CHECK (next_block >= 0),
    status       text        NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'failed')),
    error        text        NULL,
    found        integer     NOT NULL DEFAULT 0 CHECK (found >= 0),
    requested_by text        NOT NULL DEFAULT 'admin' CHECK (requested_by IN ('admin', 'backfill')),
    lease_owner  text        NULL,
    lease_until  timestamptz NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rescan_jobs_range CHECK (from_block <= to_block + 1),
    -- Only a running backfill waits for its end.
    CONSTRAINT rescan_jobs_end_pending CHECK (NOT end_pending OR (requested_by = 'backfill' AND status = 'running')),
    CONSTRAINT rescan_jobs_failed_error CHECK ((status = 'failed') = (error IS NOT NULL))
);
-- The jobs a scheduler may claim, oldest first.
CREATE INDEX rescan_jobs_running ON rescan_jobs (created_at) WHERE status = 'running';

-- The scanner's deposits (and the other providers' of this round, so that
-- no migration of theirs has to drop 'scanner' again). The old constraint
-- allowed a subset, so every existing row satisfies the new one: NOT VALID
-- skips a scan under lock.
ALTER TABLE payment_events DROP CONSTRAINT payment_events_source_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_source_check
    CHECK (source IN ('payments', 'alchemy', 'reorg', 'scanner', 'quicknode', 'moralis')) NOT VALID;
