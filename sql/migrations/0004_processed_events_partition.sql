-- Step 2: processed_events becomes a table partitioned by day on
-- created_at. The existing rows stay where they are, attached as the
-- partition of everything before the first day boundary after this
-- migration; new days get their own partitions, and cleanup drops whole
-- partitions instead of deleting rows (it still trims that first one).
--
-- Uniqueness of idempotency_key alone cannot be declared across
-- partitions (the key must include created_at). It is kept by the ledger,
-- which reads a key and writes it while holding its event's row lock, and
-- guarded, as always, by balance_events' UNIQUE (source_event_id,
-- event_type).

-- Creates the daily partitions from day start for days days, skipping
-- those that exist. Named processed_events_pYYYYMMDD (UTC days).
CREATE FUNCTION settle_processed_partitions_ahead(start timestamptz, days integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day     timestamptz := date_trunc('day', start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    name    text;
    created integer := 0;
BEGIN
    FOR i IN 0 .. days - 1 LOOP
        name := 'processed_events_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF processed_events FOR VALUES FROM (%L) TO (%L)',
                               name, day, day + interval '1 day');
                created := created + 1;
            EXCEPTION WHEN invalid_object_definition THEN
                -- The day is still covered by the pre-partitioning partition.
                NULL;
            END;
        END IF;
        day := day + interval '1 day';
    END LOOP;
    RETURN created;
END;
$$;

-- The legacy rows' bound, proven by a constraint so ATTACH skips its scan.
-- The boundary is the next midnight (UTC) at least an hour away, so rows
-- written while this runs still fall before it.
DO $$
DECLARE
    boundary timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC' + interval '1 hour') AT TIME ZONE 'UTC' + interval '1 day';
BEGIN
    EXECUTE format('ALTER TABLE processed_events ADD CONSTRAINT processed_events_legacy_bound CHECK (created_at < %L)', boundary);
    ALTER TABLE processed_events RENAME TO processed_events_legacy;
    -- A partition takes its primary key from the parent's; the unique index
    -- on (idempotency_key, created_at) built by 0003 becomes it.
    ALTER TABLE processed_events_legacy DROP CONSTRAINT processed_events_pkey;
    ALTER INDEX processed_events_terminal RENAME TO processed_events_legacy_terminal;
    ALTER INDEX processed_events_pending RENAME TO processed_events_legacy_pending;

    CREATE TABLE processed_events (
        -- Named as on the rows being attached, which must carry the same.
        idempotency_key text        NOT NULL CONSTRAINT processed_events_idempotency_key_check CHECK (idempotency_key ~ '^[0-9a-f]{64}$'),
        event_id        text        NOT NULL,
        outcome         text        NOT NULL DEFAULT 'pending'
                        CONSTRAINT processed_events_outcome_check
                        CHECK (outcome IN ('pending', 'success', 'insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch', 'dead_lettered')),
        created_at      timestamptz NOT NULL DEFAULT now(),
        updated_at      timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (idempotency_key, created_at)
    ) PARTITION BY RANGE (created_at);
    -- Lookups by key use the primary key's leading column.
    CREATE INDEX processed_events_pending ON processed_events (created_at) WHERE outcome = 'pending';

    EXECUTE format('ALTER TABLE processed_events ATTACH PARTITION processed_events_legacy FOR VALUES FROM (MINVALUE) TO (%L)', boundary);

    -- A catch-all, so an insert can never fail for want of a partition;
    -- the maintenance job alerts if anything lands here.
    CREATE TABLE processed_events_default PARTITION OF processed_events DEFAULT;

    PERFORM settle_processed_partitions_ahead(boundary, 30);
END;
$$ LANGUAGE plpgsql;
