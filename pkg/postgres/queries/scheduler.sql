-- name: claim_period
-- The replica that moves a job's last_period forward owns that period;
-- everyone else sees no row and skips it.
INSERT INTO scheduler_jobs (job, last_period, last_owner)
VALUES ($1, $2, $3)
ON CONFLICT (job) DO UPDATE
    SET last_period = EXCLUDED.last_period, last_owner = EXCLUDED.last_owner, last_run_at = now()
    WHERE scheduler_jobs.last_period < EXCLUDED.last_period
RETURNING job;
