-- Where a network has no RPC, a provider's word is the evidence that a
-- transfer is on the chain or taken away by a reorg, and its deliveries
-- may come in any order (a retried add after its removal, a retried
-- removal after the transfer's re-add in a new block). Each report that
-- names the block it saw the transfer in is kept here; a block reported
-- removed stays removed (a later report of it is a stale redelivery), and
-- the transfer is on the chain while some block it was reported in is not
-- removed. Rows exist only for such networks and such reports (Alchemy's
-- token logs), and only for deposit addresses; older than RETENTION they
-- are deleted with the transfer reports. No foreign key: a removal may be
-- delivered before its transfer's first report.
SET LOCAL lock_timeout = '5s';

CREATE TABLE transfer_sightings (
    event_id   text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 256),
    block_hash text        NOT NULL CHECK (length(block_hash) = 66 AND block_hash ~ '^0x[0-9a-f]*$'),
    removed    boolean     NOT NULL,
    reporter   text        NOT NULL CHECK (reporter ~ '^[a-z][a-z0-9_]{0,31}$'),
    first_at   timestamptz NOT NULL DEFAULT now(),
    removed_at timestamptz,
    PRIMARY KEY (event_id, block_hash),
    CHECK (removed = (removed_at IS NOT NULL))
);
CREATE INDEX transfer_sightings_first_at ON transfer_sightings (first_at);
