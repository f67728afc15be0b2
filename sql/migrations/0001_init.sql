-- settle's base schema. Table names are part of the external contract
-- (operators query them); columns beyond CONTRACT.md are ours.

CREATE TABLE users (
    id         bigint      PRIMARY KEY CHECK (id > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The asset registry. A token is recognised only by its contract address
-- on its network, never by its symbol.
CREATE TABLE assets (
    code             text     PRIMARY KEY CHECK (code ~ '^[A-Z][A-Z0-9]{0,15}$'),
    network          text     NOT NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    contract_address text     NULL CHECK (contract_address ~ '^0x[0-9a-f]{40}$'),
    decimals         smallint NOT NULL CHECK (decimals BETWEEN 0 AND 18),
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (network, contract_address)
);
-- One native asset per network.
CREATE UNIQUE INDEX assets_native_per_network ON assets (network) WHERE contract_address IS NULL;

INSERT INTO assets (code, network, contract_address, decimals) VALUES
    ('ETH',  'ETH_MAINNET', NULL, 18),
    ('USDC', 'ETH_MAINNET', '0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48', 6),
    ('USDT', 'ETH_MAINNET', '0xdac17f958d2ee523a2206206994597c13d831ec7', 6),
    ('WBTC', 'ETH_MAINNET', '0x2260fac5e5542a773aa44fbcfedf7c193bc2c599', 8),
    ('DAI',  'ETH_MAINNET', '0x6b175474e89094c44da98b954eedeac495271d0f', 18),
    ('WETH', 'ETH_MAINNET', '0xc02aaa39b223fe8d0a0e5c4f27ead9083c756cc2', 18);

-- One row per (user, asset). initial_balance is what the user held before
-- settle's journal began; balance = initial_balance + SUM(balance_events).
CREATE TABLE balances (
    user_id         bigint         NOT NULL REFERENCES users (id),
    asset           text           NOT NULL REFERENCES assets (code),
    balance         numeric(38,18) NOT NULL DEFAULT 0 CHECK (balance >= 0),
    initial_balance numeric(38,18) NOT NULL DEFAULT 0 CHECK (initial_balance >= 0),
    updated_at      timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, asset)
);
-- Hot rows updated many times a second: room on the page keeps the
-- updates HOT (no index entry), and early vacuum keeps the table small.
ALTER TABLE balances SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01);

-- Deposit addresses map a chain address to the user it belongs to; the
-- provider only knows the address, never the user.
CREATE TABLE deposit_addresses (
    network    text        NOT NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    address    text        NOT NULL CHECK (address ~ '^0x[0-9a-f]{40}$'),
    user_id    bigint      NOT NULL REFERENCES users (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network, address)
);
CREATE INDEX deposit_addresses_user ON deposit_addresses (user_id);

-- The outbox: the API commits an event here as 'pending'; the scheduler
-- moves it to the queue; the ledger makes it terminal.
--
-- user_id and asset carry no foreign keys on purpose: an FK check takes a
-- KEY SHARE lock on the referenced row, and with every event pointing at
-- one of six asset rows (and a hot user's row) that lock turns into a
-- stream of multixacts at webhook rates. Users and assets are never
-- deleted; the API checks both inside the insert statement, and the
-- ledger locks the balances row, which does have its foreign keys.
CREATE TABLE payment_events (
    -- Callers may send ids of up to 200 characters; settle's own
    -- compensations prefix "reorg:" to the original's id.
    event_id         text           PRIMARY KEY CHECK (length(event_id) BETWEEN 1 AND 256),
    event_type       text           NOT NULL CHECK (event_type IN ('deposit', 'airdrop', 'withdrawal', 'withdrawal_fee', 'reorg_compensation')),
    user_id          bigint         NOT NULL,
    asset            text           NOT NULL,
    amount           numeric(38,18) NOT NULL CHECK (amount > 0),
    status           text           NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'enqueued', 'processing', 'awaiting_finality', 'confirmed', 'failed')),
    -- Times stale recovery sent the event back to 'pending'.
    retry_count      integer        NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    -- Times the event was handed to the queue afresh; part of the task id,
    -- so a task of an older generation is recognised as stale.
    generation       integer        NOT NULL DEFAULT 0 CHECK (generation >= 0),
    tx_hash          text           NULL CHECK (tx_hash ~ '^0x[0-9a-f]{64}$'),
    -- SHA-256 of the canonical content: a redelivery with another content
    -- is a conflict, not a silent duplicate.
    content_hash     bytea          NOT NULL CHECK (length(content_hash) = 32),
    trace_id         text           NOT NULL DEFAULT '',
    source           text           NOT NULL DEFAULT 'payments' CHECK (source IN ('payments', 'alchemy', 'reorg')),
    -- The deposit a compensation reverses.
    related_event_id text           NULL,
    -- Chain facts: the recipient the provider named (token deposits are
    -- checked against it), the block the receipt was seen in, and whether a
    -- credited deposit is still watched for reorgs.
    to_address       text           NULL CHECK (to_address ~ '^0x[0-9a-f]{40}$'),
    block_number     bigint         NULL,
    block_hash       text           NULL,
    receipt_seen_at  timestamptz    NULL,
    chain_state      text           NULL CHECK (chain_state IN ('watching', 'final', 'reorged')),
    next_check_at    timestamptz    NULL,
    check_count      integer        NOT NULL DEFAULT 0,
    outcome          text           NULL CHECK (outcome IN ('success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch', 'dead_lettered')),
    error            text           NULL,
    created_at       timestamptz    NOT NULL DEFAULT now(),
    updated_at       timestamptz    NOT NULL DEFAULT now(),
    -- A terminal event always says how it ended; a live one never does.
    CONSTRAINT payment_events_outcome_terminal CHECK ((status IN ('confirmed', 'failed')) = (outcome IS NOT NULL)),
    CONSTRAINT payment_events_awaiting_has_check CHECK (status <> 'awaiting_finality' OR next_check_at IS NOT NULL)
);
-- One partial index per live status, each small however large the table
-- grows. Every status change writes a new row version into each index
-- whose predicate it matches (a status change is never a HOT update), so
-- terminal rows are deliberately in no index but the primary key.
CREATE INDEX payment_events_pending    ON payment_events (created_at)    WHERE status = 'pending';
CREATE INDEX payment_events_enqueued   ON payment_events (updated_at)    WHERE status = 'enqueued';
CREATE INDEX payment_events_processing ON payment_events (updated_at)    WHERE status = 'processing';
CREATE INDEX payment_events_awaiting   ON payment_events (next_check_at) WHERE status = 'awaiting_finality';
CREATE INDEX payment_events_watching   ON payment_events (updated_at)    WHERE chain_state = 'watching';
-- The outbox churns: vacuum it early so the partial indexes do not fill
-- with dead entries the claim has to step over.
ALTER TABLE payment_events SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02,
                                autovacuum_vacuum_insert_scale_factor = 0.05, fillfactor = 90);

-- The transition table of pkg/payment/status.go, mirrored: a status write
-- that is not an allowed edge is refused by the database itself. The test
-- lives in the triggers' WHEN clauses, which PostgreSQL evaluates without
-- calling a function; the function runs only to raise the refusal.
CREATE FUNCTION payment_events_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'payment event % must be inserted as pending, not %', NEW.event_id, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'payment event %: transition % -> % is not allowed', NEW.event_id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER payment_events_insert_guard BEFORE INSERT ON payment_events
    FOR EACH ROW WHEN (NEW.status <> 'pending')
    EXECUTE FUNCTION payment_events_refuse();
CREATE TRIGGER payment_events_transition_guard BEFORE UPDATE OF status ON payment_events
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND (OLD.status, NEW.status) NOT IN (
        ('pending', 'enqueued'), ('pending', 'failed'),
        ('enqueued', 'processing'), ('enqueued', 'failed'), ('enqueued', 'pending'),
        ('enqueued', 'confirmed'), ('enqueued', 'awaiting_finality'),
        ('processing', 'confirmed'), ('processing', 'failed'),
        ('awaiting_finality', 'enqueued'), ('awaiting_finality', 'failed'),
        ('failed', 'pending')))
    EXECUTE FUNCTION payment_events_refuse();

-- Raises when ok is false: lets a statement pipelined ahead of COMMIT
-- abort the transaction when what it changed is not what was expected.
CREATE FUNCTION settle_assert(ok boolean, message text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION 'settle assertion failed: %', message USING ERRCODE = 'P0001';
    END IF;
    RETURN true;
END;
$$;

-- The idempotency record, written in the same transaction as the balance
-- change. The key is the length-prefixed SHA-256 of (event_id, event_type).
CREATE TABLE processed_events (
    idempotency_key text        PRIMARY KEY CHECK (idempotency_key ~ '^[0-9a-f]{64}$'),
    event_id        text        NOT NULL,
    outcome         text        NOT NULL DEFAULT 'pending'
                    CHECK (outcome IN ('pending', 'success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch', 'dead_lettered')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX processed_events_terminal ON processed_events (created_at) WHERE outcome <> 'pending';
CREATE INDEX processed_events_pending  ON processed_events (created_at) WHERE outcome = 'pending';
ALTER TABLE processed_events SET (autovacuum_vacuum_scale_factor = 0.02);

-- The journal. Its unique constraint is the last line of defence, still
-- there after processed_events rows are cleaned up.
CREATE TABLE balance_events (
    id              bigserial      PRIMARY KEY,
    user_id         bigint         NOT NULL,
    asset           text           NOT NULL,
    amount          numeric(38,18) NOT NULL CHECK (amount <> 0),
    event_type      text           NOT NULL,
    source_event_id text           NOT NULL,
    created_at      timestamptz    NOT NULL DEFAULT now(),
    -- No foreign key to balances: only the ledger writes here, always
    -- while it holds that balances row FOR UPDATE.
    UNIQUE (source_event_id, event_type)
);
CREATE INDEX balance_events_user_asset ON balance_events (user_id, asset);
CREATE INDEX balance_events_created    ON balance_events (created_at);

-- One row per failed attempt (a surrogate key, so no ON CONFLICT on the
-- event). Replay and discard are human decisions, recorded here.
CREATE TABLE dead_letter_queue (
    id                bigserial      PRIMARY KEY,
    event_id          text           NOT NULL,
    event_type        text           NOT NULL,
    user_id           bigint         NULL,
    asset             text           NULL,
    amount            numeric(38,18) NULL,
    error             text           NOT NULL,
    attempt           integer        NOT NULL DEFAULT 0,
    generation        integer        NOT NULL DEFAULT 0,
    source            text           NOT NULL CHECK (source IN ('worker', 'recovery', 'ledger', 'chain', 'drain')),
    trace_id          text           NOT NULL DEFAULT '',
    payload           jsonb          NULL,
    -- Set on entries that passed through the Redis fallback; the drain
    -- inserts each at most once even if it runs twice.
    fallback_id       text           NULL UNIQUE,
    created_at        timestamptz    NOT NULL DEFAULT now(),
    resolution        text           NULL CHECK (resolution IN ('replayed', 'discarded')),
    resolved_by       text           NULL,
    resolved_at       timestamptz    NULL,
    resolution_reason text           NULL,
    CONSTRAINT dead_letter_queue_resolution CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE INDEX dead_letter_queue_open    ON dead_letter_queue (created_at) WHERE resolution IS NULL;
CREATE INDEX dead_letter_queue_event   ON dead_letter_queue (event_id);
CREATE INDEX dead_letter_queue_created ON dead_letter_queue (created_at);

-- User-facing side effects, written inside the ledger transaction and
-- delivered afterwards; delivery_id is what the receiver deduplicates on.
CREATE TABLE notification_outbox (
    id              bigserial   PRIMARY KEY,
    delivery_id     text        NOT NULL UNIQUE,
    event_id        text        NOT NULL,
    user_id         bigint      NOT NULL,
    kind            text        NOT NULL,
    payload         jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text        NULL,
    trace_id        text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz NULL
);
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at) WHERE status = 'pending';

-- One row per periodic job: a replica runs a job's period only if it moves
-- last_period forward, so two schedulers never fire one period twice.
CREATE TABLE scheduler_jobs (
    job         text        PRIMARY KEY,
    last_period bigint      NOT NULL,
    last_owner  text        NOT NULL,
    last_run_at timestamptz NOT NULL DEFAULT now()
);
