-- settle:no-transaction
-- The deposits waiting for finality, by network, then by when each is
-- due: the enqueuer's claim gives each network its own share of the
-- re-checks (queries/outbox.sql), finding the networks with one probe of
-- this index each and each network's due deposits in order. Rows from
-- before networks existed (network NULL) are one group, ''. Small
-- however large the table grows (only waiting rows), built concurrently
-- so ingest and the ledger go on; re-runnable.
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_events_awaiting_network
    ON payment_events (COALESCE(network, ''), next_check_at) WHERE status = 'awaiting_finality';
