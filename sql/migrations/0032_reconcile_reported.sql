-- A full reconciliation pass is advanced by whichever run gets there
-- first: the scheduler's, which counts and alerts, or settlectl
-- reconcile's, which only prints. reported counts the pass's mismatches
-- the scheduler has counted and alerted on, so each pages once whoever
-- recorded it. Passes from before are taken as reported: their runs
-- alerted what they found. reconcile_runs holds a row a pass: small.
SET LOCAL lock_timeout = '5s';

ALTER TABLE reconcile_runs
    ADD COLUMN reported bigint NOT NULL DEFAULT 0 CHECK (reported >= 0);

UPDATE reconcile_runs SET reported = mismatches;

ALTER TABLE reconcile_runs
    ADD CONSTRAINT reconcile_runs_reported CHECK (reported <= mismatches);
