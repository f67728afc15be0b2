-- One on-chain transfer settles at most one withdrawal_post. A post with
-- a transaction that the chain checked claims the transfer that pays its
-- hold here, in the ledger transaction that debits it; a second post
-- naming the same transfer (two holds of one amount to one address, both
-- posted with one transaction hash) ends failed/duplicate_transfer and its
-- hold stays open. Apart from chain_transfers: one transfer can be both a
-- payout and a user's deposit (the hot wallet paying a deposit address).
--
-- transfer names the transfer within its transaction: 'native', a trace
-- index, or 'log:<n>' for the transaction's n-th log (from 0). A log
-- index counts within its block and changes when a reorg mines the
-- transaction in another block; its place among the transaction's logs
-- does not, so the key holds across blocks. transfer_index and block_hash
-- say where it was when claimed.
SET LOCAL lock_timeout = '5s';

-- The format rules in 0020's form: a length test beside an unbounded
-- class, not counted repetition.
CREATE TABLE payout_transfers (
    network        text        NOT NULL CHECK (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$'),
    tx_hash        text        NOT NULL CHECK (length(tx_hash) = 66 AND tx_hash ~ '^0x[0-9a-f]*$'),
    transfer       text        NOT NULL CHECK (length(transfer) <= 14 AND transfer ~ '^log:[0-9]+$' OR transfer = 'native'
                                               OR length(transfer) <= 102 AND transfer ~ '^trace:[A-Za-z0-9_]+$'),
    transfer_index text        NOT NULL CHECK (length(transfer_index) <= 20 AND transfer_index ~ '^[0-9]+$' OR transfer_index = 'native'
                                               OR length(transfer_index) <= 102 AND transfer_index ~ '^trace:[A-Za-z0-9_]+$'),
    block_hash     text        NOT NULL CHECK (length(block_hash) = 66 AND block_hash ~ '^0x[0-9a-f]*$'),
    asset          text        NOT NULL,
    event_id       text        NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network, tx_hash, transfer)
);
