-- Which networks the workers can ask the chain of (they have
-- RPC_URL_<NETWORK>), each reported by the workers at start and every few
-- minutes. A provider's reorg report (Alchemy's removed, QuickNode's
-- blocks_reorged) is evidence only on a network whose chain cannot be
-- asked; the api decides that by this table as well as by its own
-- settings, since it is the workers' chain that decides a deposit.
SET LOCAL lock_timeout = '5s';

CREATE TABLE network_rpc_reports (
    network     text        PRIMARY KEY CHECK (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$'),
    reported_at timestamptz NOT NULL
);
