-- The format rules of the hot path's tables without counted repetition
-- ({64}, {0,63}): PostgreSQL's regex engine runs '^0x[0-9a-f]{64}$' at
-- about 3 us a row and {40} or {0,63} at about 1 us, where a length test
-- beside an unbounded class ('^0x[0-9a-f]*$') takes 0.3 us. A provider's
-- deposit carries a network, a recipient, a transaction hash and a
-- transfer index, checked on its INSERT and again on each UPDATE of the
-- row (a CHECK does not know which columns changed): about 17 us of
-- PostgreSQL's CPU per write of payment_events in PL/pgSQL, 1.8 us
-- with the new forms. Every row a rule accepted before it accepts now
-- and no other (TestFormatChecksAsBefore compares each against its old
-- pattern over generated strings).
--
-- payment_events keeps its one CHECK: the function is replaced in
-- place, with no lock on the table. The other tables' constraints are
-- dropped and added again under the same names, NOT VALID (every row
-- has met the old form, which is the same rule): no scan, a brief lock,
-- waited for at most lock_timeout (run the migration again if it times
-- out). On processed_events the partitions follow their parent.
SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION payment_events_check(
    event_id text, event_type text, status text, outcome text, amount numeric,
    retry_count integer, generation integer, content_hash bytea, source text,
    chain_state text, next_check_at timestamptz, hold_id text, network text,
    to_address text, traceparent text, transfer_index text, tx_hash text
) RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT (length(event_id) >= 1 AND length(event_id) <= 256) THEN 'event_id_check'
        WHEN NOT (event_type = ANY ('{deposit,airdrop,withdrawal,withdrawal_fee,reorg_compensation,withdrawal_hold,withdrawal_post,withdrawal_void}'::text[])) THEN 'event_type_check'
        WHEN NOT (status = ANY ('{pending,enqueued,processing,awaiting_finality,confirmed,failed}'::text[])) THEN 'status_check'
        WHEN NOT (outcome = ANY ('{success,insufficient_funds,reorged,reverted,not_found,mismatch,dead_lettered,duplicate_transfer,held,hold_closed,unknown_hold}'::text[])) THEN 'outcome_check'
        WHEN NOT (retry_count >= 0) THEN 'retry_count_check'
        WHEN NOT (generation >= 0) THEN 'generation_check'
        WHEN NOT (length(content_hash) = 32) THEN 'content_hash_check'
        WHEN NOT (source = ANY ('{payments,alchemy,reorg,scanner,quicknode,moralis}'::text[])) THEN 'source_check'
        WHEN NOT (chain_state = ANY ('{watching,final,reorged}'::text[])) THEN 'chain_state_check'
        WHEN NOT (length(hold_id) >= 1 AND length(hold_id) <= 256) THEN 'hold_id_check'
        WHEN NOT (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$') THEN 'network_check'
        WHEN NOT (length(to_address) = 42 AND to_address ~ '^0x[0-9a-f]*$') THEN 'to_address_check'
        WHEN NOT (length(traceparent) = 55 AND traceparent ~ '^00-[0-9a-f]*-[0-9a-f]*-[0-9a-f]*$'
                  AND substr(traceparent, 36, 1) = '-' AND substr(traceparent, 53, 1) = '-') THEN 'traceparent_format'
        WHEN NOT (length(transfer_index) <= 20 AND transfer_index ~ '^[0-9]+$' OR transfer_index = 'native'
                  OR length(transfer_index) <= 102 AND transfer_index ~ '^trace:[A-Za-z0-9_]+$') THEN 'transfer_index_check'
        WHEN NOT (length(tx_hash) = 66 AND tx_hash ~ '^0x[0-9a-f]*$') THEN 'tx_hash_check'
        WHEN NOT (amount > 0 OR amount = 0 AND event_type = ANY ('{withdrawal_post,withdrawal_void}'::text[])) THEN 'amount_check'
        WHEN NOT (status <> 'awaiting_finality' OR next_check_at IS NOT NULL) THEN 'awaiting_has_check'
        WHEN NOT ((hold_id IS NOT NULL) = (event_type = ANY ('{withdrawal_post,withdrawal_void}'::text[]))) THEN 'hold_id_types'
        WHEN NOT ((outcome IS DISTINCT FROM 'held' OR status = 'confirmed' AND event_type = 'withdrawal_hold')
                  AND (outcome <> ALL ('{hold_closed,unknown_hold}'::text[])
                       OR status = 'failed' AND event_type = ANY ('{withdrawal_post,withdrawal_void}'::text[]))) THEN 'hold_outcomes'
        WHEN NOT ((status = ANY ('{confirmed,failed}'::text[])) = (outcome IS NOT NULL)) THEN 'outcome_terminal'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'payment event % breaks payment_events_%', event_id, broken
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_events_' || broken,
                  TABLE = 'payment_events';
    END IF;
    RETURN true;
END;
$$;

ALTER TABLE processed_events
    DROP CONSTRAINT processed_events_idempotency_key_check,
    ADD CONSTRAINT processed_events_idempotency_key_check
        CHECK (length(idempotency_key) = 64 AND idempotency_key ~ '^[0-9a-f]*$') NOT VALID;
ALTER TABLE chain_transfers
    DROP CONSTRAINT chain_transfers_network_check,
    DROP CONSTRAINT chain_transfers_tx_hash_check,
    DROP CONSTRAINT chain_transfers_transfer_index_check,
    DROP CONSTRAINT chain_transfers_block_hash_check,
    ADD CONSTRAINT chain_transfers_network_check CHECK (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$') NOT VALID,
    ADD CONSTRAINT chain_transfers_tx_hash_check CHECK (length(tx_hash) = 66 AND tx_hash ~ '^0x[0-9a-f]*$') NOT VALID,
    ADD CONSTRAINT chain_transfers_transfer_index_check CHECK (length(transfer_index) <= 20 AND transfer_index ~ '^[0-9]+$'
        OR transfer_index = 'native' OR length(transfer_index) <= 102 AND transfer_index ~ '^trace:[A-Za-z0-9_]+$'
        OR transfer_index ~ '^unresolved:.') NOT VALID,
    ADD CONSTRAINT chain_transfers_block_hash_check CHECK (length(block_hash) = 66 AND block_hash ~ '^0x[0-9a-f]*$') NOT VALID;
ALTER TABLE balance_events
    DROP CONSTRAINT balance_events_network_check,
    ADD CONSTRAINT balance_events_network_check
        CHECK (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$') NOT VALID;
ALTER TABLE holds
    DROP CONSTRAINT holds_network_check,
    DROP CONSTRAINT holds_to_address_check,
    ADD CONSTRAINT holds_network_check CHECK (length(network) <= 64 AND network ~ '^[A-Z][A-Z0-9_]*$') NOT VALID,
    ADD CONSTRAINT holds_to_address_check CHECK (length(to_address) = 42 AND to_address ~ '^0x[0-9a-f]*$') NOT VALID;
ALTER TABLE transfer_reports
    DROP CONSTRAINT transfer_reports_reporter_check,
    ADD CONSTRAINT transfer_reports_reporter_check
        CHECK (length(reporter) <= 32 AND reporter ~ '^[a-z][a-z0-9_]*$') NOT VALID;
