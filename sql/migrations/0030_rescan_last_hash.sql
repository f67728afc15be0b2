-- The hash of the last block a rescan job's latest pass read (the block
-- before next_block), as that pass read it. Under confirmations:N or
-- none a job's passes can straddle a fork, or be answered by backends on
-- different branches: the next pass's first block must name it as its
-- parent, else the job's range is read again (the part before it may be
-- the other branch's). NULL: not known (a new or restarted job, one from
-- before this, or under finalized, where nothing read can change). A new
-- column without a default: metadata only, no rewrite.
SET LOCAL lock_timeout = '5s';

ALTER TABLE rescan_jobs
    ADD COLUMN last_hash text NULL CHECK (length(last_hash) = 66 AND last_hash ~ '^0x[0-9a-f]*$');
