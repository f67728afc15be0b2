-- The hash of the last block a cursor pass read (the block before
-- next_block), as the pass saw it before reading. Under confirmations:N
-- or none, a reorg deeper than the policy can replace blocks the cursor
-- has passed, and their new transactions would never be scanned: the
-- next pass compares this hash with the chain's and, on a difference,
-- asks for a rescan of the blocks below (SCAN_REORG_RESCAN). NULL: not
-- known yet (a cursor from before this, or under finalized, where
-- nothing the cursor passed can change). A new column without a
-- default: metadata only, no rewrite.
SET LOCAL lock_timeout = '5s';

ALTER TABLE chain_cursors
    ADD COLUMN last_hash text NULL CHECK (length(last_hash) = 66 AND last_hash ~ '^0x[0-9a-f]*$');
