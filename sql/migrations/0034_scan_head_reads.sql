-- When a scanner last read each network's finality head, so that a
-- restarted scheduler exports that time as
-- settle_scan_lag_updated_timestamp_seconds instead of its own start: a
-- restart, or a crash loop, while the node answers no head neither
-- clears nor delays SettleScannerHeadUnread. read_at is set by the cursor
-- passes at most once a SCAN_INTERVAL per network, in the writer's clock
-- (the gauge's); NULL: never read. started_at is when a scanner first
-- followed the network, what a network never read counts from. A new
-- table, a row a network.
SET LOCAL lock_timeout = '5s';

CREATE TABLE scan_head_reads (
    network    text        PRIMARY KEY CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    started_at timestamptz NOT NULL,
    read_at    timestamptz NULL
);
