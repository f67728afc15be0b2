-- The alert for a pass's mismatches reported later (those settlectl
-- recorded, claimed by the scheduler) showed the pass's first sample,
-- which may be of mismatches reported earlier. unreported_sample is the
-- sample of the first chunk with mismatches since the last report
-- (at most 5, like sample), cleared when they are reported. '' on rows
-- from before: their report falls back to sample. A new column with a
-- constant default: no rewrite.
SET LOCAL lock_timeout = '5s';

ALTER TABLE reconcile_runs
    ADD COLUMN unreported_sample text NOT NULL DEFAULT '';
