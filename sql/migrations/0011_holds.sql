-- Holds: a withdrawal reserved first (withdrawal_hold), then settled on
-- chain (withdrawal_post) or released (withdrawal_void). CONTRACT.md,
-- "Holds: withdrawals settled on chain".

-- The new event types and outcomes. The old constraints allowed a subset
-- of the new ones, so every existing row satisfies them: NOT VALID skips a
-- scan under lock.
ALTER TABLE payment_events DROP CONSTRAINT payment_events_event_type_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_event_type_check
    CHECK (event_type IN ('deposit', 'airdrop', 'withdrawal', 'withdrawal_fee', 'reorg_compensation',
                          'withdrawal_hold', 'withdrawal_post', 'withdrawal_void')) NOT VALID;
ALTER TABLE payment_events DROP CONSTRAINT payment_events_outcome_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_outcome_check
    CHECK (outcome IN ('success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch',
                       'dead_lettered', 'duplicate_transfer', 'held', 'hold_closed', 'unknown_hold')) NOT VALID;
-- The hold outcomes belong to their types and statuses: held is a
-- confirmed hold, hold_closed and unknown_hold failed posts or voids.
ALTER TABLE payment_events ADD CONSTRAINT payment_events_hold_outcomes
    CHECK ((outcome IS DISTINCT FROM 'held' OR (status = 'confirmed' AND event_type = 'withdrawal_hold'))
           AND (outcome NOT IN ('hold_closed', 'unknown_hold')
                OR (status = 'failed' AND event_type IN ('withdrawal_post', 'withdrawal_void')))) NOT VALID;
ALTER TABLE processed_events DROP CONSTRAINT processed_events_outcome_check;
ALTER TABLE processed_events ADD CONSTRAINT processed_events_outcome_check
    CHECK (outcome IN ('pending', 'success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch',
                       'dead_lettered', 'duplicate_transfer', 'reopened', 'held', 'hold_closed', 'unknown_hold'));

-- The hold a post or void resolves (set exactly on those), and the
-- network a hold pays out on (to_address, from 0001, is its recipient).
-- Nullable columns without a default: metadata only, no rewrite.
ALTER TABLE payment_events
    ADD COLUMN hold_id text NULL CHECK (length(hold_id) BETWEEN 1 AND 256),
    ADD COLUMN network text NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$');
ALTER TABLE payment_events ADD CONSTRAINT payment_events_hold_id_types
    CHECK ((hold_id IS NOT NULL) = (event_type IN ('withdrawal_post', 'withdrawal_void'))) NOT VALID;

-- held = SUM(open holds) of the (user, asset), kept by the ledger in the
-- transaction that opens or resolves a hold. The CHECK is invariant 4 as
-- the database's own last guard: no committed state reserves more than
-- the balance, and available = balance - held is never negative. Every
-- existing row has held = 0 <= balance (balance >= 0 by CHECK).
ALTER TABLE balances ADD COLUMN held numeric(38,18) NOT NULL DEFAULT 0;
ALTER TABLE balances ADD CONSTRAINT balances_held_within CHECK (held >= 0 AND held <= balance) NOT VALID;

-- One row per hold that reserved money (a hold refused for insufficient
-- funds has none). hold_id is the withdrawal_hold's event id. The state
-- machine is pkg/payment/hold.go's table: open -> posted | voided, each
-- hold resolved once; a resolved hold says when and by which event.
CREATE TABLE holds (
    hold_id     text           PRIMARY KEY CHECK (length(hold_id) BETWEEN 1 AND 256),
    user_id     bigint         NOT NULL,
    asset       text           NOT NULL,
    amount      numeric(38,18) NOT NULL CHECK (amount > 0),
    network     text           NOT NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    to_address  text           NULL CHECK (to_address ~ '^0x[0-9a-f]{40}$'),
    status      text           NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'posted', 'voided')),
    created_at  timestamptz    NOT NULL DEFAULT now(),
    resolved_at timestamptz    NULL,
    resolved_by text           NULL,
    -- resolved_at and resolved_by are set exactly when the hold is no
    -- longer open.
    CONSTRAINT holds_resolution CHECK ((status = 'open') = (resolved_at IS NULL)
                                       AND (status = 'open') = (resolved_by IS NULL)),
    -- No foreign key to balances: only the ledger writes here, always
    -- while it holds that balances row FOR UPDATE.
    CONSTRAINT holds_user_asset CHECK (user_id > 0)
);
-- Open holds per (user, asset): invariant 4 and the balance reads.
CREATE INDEX holds_open ON holds (user_id, asset) WHERE status = 'open';
CREATE INDEX holds_user ON holds (user_id, created_at);

-- The transition table mirrored, as for payment_events: a hold is
-- inserted open, and only open -> posted and open -> voided are moves; the
-- facts of a hold never change.
CREATE FUNCTION holds_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'hold % must be inserted open, not %', NEW.hold_id, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'hold %: transition % -> % is not allowed', NEW.hold_id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER holds_insert_guard BEFORE INSERT ON holds
    FOR EACH ROW WHEN (NEW.status <> 'open')
    EXECUTE FUNCTION holds_refuse();
CREATE TRIGGER holds_transition_guard BEFORE UPDATE ON holds
    FOR EACH ROW WHEN ((OLD.status, NEW.status) NOT IN (('open', 'posted'), ('open', 'voided'))
                       OR OLD.user_id <> NEW.user_id OR OLD.asset <> NEW.asset OR OLD.amount <> NEW.amount
                       OR OLD.network <> NEW.network OR OLD.to_address IS DISTINCT FROM NEW.to_address)
    EXECUTE FUNCTION holds_refuse();

-- A post or void whose hold_id named no hold when it was accepted, and
-- that gave no amount, carries amount 0: it ends failed/unknown_hold and
-- moves nothing. Every other event moves a positive amount. The new rule
-- allows more than the old, so existing rows need no scan (NOT VALID).
ALTER TABLE payment_events DROP CONSTRAINT payment_events_amount_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_amount_check
    CHECK (amount > 0 OR (amount = 0 AND event_type IN ('withdrawal_post', 'withdrawal_void'))) NOT VALID;
