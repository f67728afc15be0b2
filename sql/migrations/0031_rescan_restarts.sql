-- A rescan job's restarts (the branch changed under it between its
-- passes, migration 0030) were only logged and counted: the job itself
-- showed none. restarts counts them, last_restart_at and
-- last_restart_reason tell the latest (shown by GET /admin/rescan/{id},
-- settlectl rescan status and the console). A constant default and two
-- nullable columns: no rewrite; the check that both are set together
-- reads rescan_jobs once, a small table.
--
-- rescan_found holds the transfers (event ids) a running job has found,
-- so that found counts each once when a restart reads blocks again; its
-- rows go when the job ends (done, failed or cancelled), so it stays as
-- small as the running jobs' finds.
SET LOCAL lock_timeout = '5s';

ALTER TABLE rescan_jobs
    ADD COLUMN restarts integer NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    ADD COLUMN last_restart_at timestamptz NULL,
    ADD COLUMN last_restart_reason text NULL CHECK (length(last_restart_reason) BETWEEN 1 AND 1000),
    ADD CONSTRAINT rescan_jobs_last_restart CHECK ((last_restart_at IS NULL) = (last_restart_reason IS NULL));

CREATE TABLE rescan_found (
    job_id   text NOT NULL REFERENCES rescan_jobs (id) ON DELETE CASCADE,
    event_id text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 256),
    PRIMARY KEY (job_id, event_id)
);
