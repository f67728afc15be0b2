-- Operations: reconciliation bookkeeping and tamper-evident balances.

-- Every change to a balance row stamps updated_at, whoever makes it, so the
-- hot-path check also sees balances changed by hand (without a journal
-- row). updated_at is deliberately not indexed: an index on it would make
-- every balance update a non-HOT update; the check scans balances instead.
CREATE FUNCTION balances_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;
CREATE TRIGGER balances_touch BEFORE UPDATE ON balances
    FOR EACH ROW EXECUTE FUNCTION balances_touch();

-- Full reconciliation passes walk every balance in key order; the cursor
-- lets an interrupted pass resume where it stopped.
CREATE TABLE reconcile_runs (
    id            bigserial   PRIMARY KEY,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz NULL,
    cursor_user   bigint      NOT NULL DEFAULT 0,
    cursor_asset  text        NOT NULL DEFAULT '',
    checked       bigint      NOT NULL DEFAULT 0,
    mismatches    bigint      NOT NULL DEFAULT 0,
    sample        text        NOT NULL DEFAULT ''
);
CREATE INDEX reconcile_runs_open ON reconcile_runs (started_at) WHERE finished_at IS NULL;
