-- Who asked for a rescan and why, as the other recorded operations keep
-- it (event_rechecks.requested_by): requested_by stays the kind ('admin'
-- or 'backfill'); operator names the person, the role or tool and where
-- from, and the reason given. NULL for rows from before this migration and
-- for backfills, whose request is the address registration itself.
-- A nullable column without a default: no table rewrite.
ALTER TABLE rescan_jobs
    ADD COLUMN operator text NULL CHECK (operator IS NULL OR length(operator) BETWEEN 1 AND 1500);
