-- settle:no-transaction
-- Step 1 of partitioning processed_events by day (0004 does the switch).
-- Run outside a transaction so that building the index does not block
-- the ledger on a large table; every statement is re-runnable.

-- The partitioned table's primary key must contain the partition key;
-- the existing rows get the matching unique index now, concurrently, so
-- attaching them as a partition in 0004 needs no rebuild under lock.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_events_key_created
    ON processed_events (idempotency_key, created_at);
