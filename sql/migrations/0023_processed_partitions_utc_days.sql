-- A daily partition of processed_events is one UTC day whatever the
-- session's TimeZone. 0004's function added interval '1 day' to a
-- timestamptz, which follows the session's time zone across a DST change
-- (settle never pins it; a database initialised in Europe has
-- 'Europe/Berlin'): the spring day came out 23 hours, its last hour went
-- to the default partition; the autumn day 25 hours, so the next day's
-- partition overlapped it, the error was swallowed as if the overlap were
-- the legacy partition's, and a whole day went to the default partition.
--
-- The function now runs in UTC (a SET on the function, restored when it
-- returns), and swallows an overlap only where processed_events_legacy
-- covers the day; any other overlap is an error for the cleanup job to
-- report.
SET LOCAL lock_timeout = '5s';
SET LOCAL TimeZone = 'UTC';

CREATE OR REPLACE FUNCTION settle_processed_partitions_ahead(start timestamptz, days integer) RETURNS integer
LANGUAGE plpgsql
SET TimeZone = 'UTC'
AS $$
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
                -- Only the pre-partitioning partition may cover a day (it
                -- ends at the first midnight after 0004 ran).
                IF NOT EXISTS (
                    SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = 'processed_events'::regclass AND c.relname = 'processed_events_legacy'
                      AND substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz > day
                ) THEN
                    RAISE;
                END IF;
            END;
        END IF;
        day := day + interval '1 day';
    END LOOP;
    RETURN created;
END;
$$;

-- Partitions the old function already created with a day that is not a
-- UTC day (days ahead, so normally empty) are made again with the right
-- bounds. One that holds rows is left as it is (dropping it would drop
-- them; the old function never created a neighbour it overlaps). The
-- table is locked before the emptiness is checked, so no row arrives
-- between the check and the drop.
DO $$
DECLARE
    p       record;
    dropped timestamptz[] := '{}';
    day     timestamptz;
    empty   boolean;
BEGIN
    FOR p IN
        SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound,
               to_timestamp(substring(c.relname FROM 19), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC' AS day
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'processed_events'::regclass AND c.relname ~ '^processed_events_p[0-9]{8}$'
    LOOP
        CONTINUE WHEN p.bound = format('FOR VALUES FROM (%L) TO (%L)', p.day, p.day + interval '1 day');
        LOCK TABLE processed_events IN ACCESS EXCLUSIVE MODE;
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', p.relname) INTO empty;
        IF empty THEN
            EXECUTE format('DROP TABLE %I', p.relname);
            dropped := dropped || p.day;
        END IF;
    END LOOP;
    FOREACH day IN ARRAY dropped LOOP
        PERFORM settle_processed_partitions_ahead(day, 1);
    END LOOP;
END;
$$;
