-- A job's period is claimed by its start time on the database's clock,
-- no longer by a number each replica computed as now/Every on its own
-- clock. A bare number shrank when an operator raised an interval, and
-- one replica whose clock ran fast stored a number from the future: in
-- both cases every later claim was refused, on every replica.
--
-- An existing row keeps its guarantee through last_run_at, the database
-- time its period was claimed at: a period that starts after it is a new
-- one, and the period that was running then is not claimed again. The old
-- number is dropped, so a scheduler still running the old build fails its
-- claims (and runs nothing) until it is replaced, rather than racing the
-- new one.
SET LOCAL lock_timeout = '5s';

ALTER TABLE scheduler_jobs ADD COLUMN last_start timestamptz;
UPDATE scheduler_jobs SET last_start = least(last_run_at, now());
ALTER TABLE scheduler_jobs
    ALTER COLUMN last_start SET NOT NULL,
    DROP COLUMN last_period;
COMMENT ON COLUMN scheduler_jobs.last_start IS
    'start of the last claimed period, on the database clock; never in its future';
