-- name: claim_period
-- $2 is the period (every) and $3 its offset from the epoch (a daily job's
-- time of day), both in microseconds. The period is the database's current
-- one, so no replica's clock decides it: a start is never in the
-- database's future, and a changed interval takes effect at once (its
-- periods start after the one stored). The replica that moves last_start
-- forward owns the period; everyone else gets won = false. The start comes
-- back either way, so a replica whose clock disagrees can tell.
WITH current AS (
    SELECT date_bin($2::bigint * interval '1 microsecond', now(),
                    'epoch'::timestamptz + $3::bigint * interval '1 microsecond') AS start
), claimed AS (
    INSERT INTO scheduler_jobs AS s (job, last_start, last_owner)
    SELECT $1, current.start, $4 FROM current
    ON CONFLICT (job) DO UPDATE
        SET last_start = EXCLUDED.last_start, last_owner = EXCLUDED.last_owner, last_run_at = now()
        WHERE s.last_start < EXCLUDED.last_start
    RETURNING job
)
SELECT current.start, EXISTS (SELECT 1 FROM claimed) FROM current;
