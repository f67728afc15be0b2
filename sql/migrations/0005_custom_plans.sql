-- settle's statements take arrays (unnest, = ANY) whose size PostgreSQL
-- cannot see in a generic plan. A generic plan made while a table was
-- small (right after deployment) scans it sequentially, and stays cached
-- for the life of the connection while the table grows: every ledger
-- batch then reads the whole outbox. Custom plans see the real arrays and
-- use the primary keys. This is a database default, not session state, so
-- it also holds behind PgBouncer; it needs the migrating role to own the
-- database, and is skipped with a notice if it does not (set it by hand:
-- ALTER DATABASE <name> SET plan_cache_mode = force_custom_plan).
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET plan_cache_mode = force_custom_plan', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'plan_cache_mode not set: the migrating role does not own database %', current_database();
END;
$$;
