-- The block each transfer a running rescan job found was in, so that the
-- job's pass keeps only the ids a restart can read again (those at most
-- SCAN_REORG_RESCAN blocks below its next block) instead of every id of
-- the job until it ends. NULL: recorded by a binary from before this;
-- such a row stays until its job ends (or the daily cleanup finds it
-- ended). A new column without a default: metadata only, no rewrite; its
-- check reads rescan_found once, a small table.
SET LOCAL lock_timeout = '5s';

ALTER TABLE rescan_found
    ADD COLUMN block_number bigint NULL CHECK (block_number >= 0);
