-- The network's finality head as the scanner last read it, while it was
-- below a running job's next_block: the job waits for the chain (a range
-- asked above the head, or one that caught up with it) and holds no other
-- job back. NULL: the job can run, or the scanner has not looked yet.
-- Shown by GET /admin/rescan/{id}, settlectl rescan status and the
-- console. A new column without a default: metadata only, no rewrite.
SET LOCAL lock_timeout = '5s';

ALTER TABLE rescan_jobs
    ADD COLUMN waiting_head bigint NULL CHECK (waiting_head >= 0);
