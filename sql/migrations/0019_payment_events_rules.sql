-- payment_events' twenty CHECK constraints as one, which calls a
-- function holding the same rules. PostgreSQL reads every CHECK of a
-- table back from its stored node tree, and prepares it, for each
-- statement that writes a row: payment_events' twenty came to 22 kB of
-- node text, read for the api's INSERT and again for the ledger's UPDATE
-- of every event (a third of PostgreSQL's time for a lone INSERT plus
-- UPDATE in pgbench: 2,000 such pairs a second with them, 2,800 with
-- this). A PL/pgSQL function is compiled once per connection; the CHECK
-- that calls it stores 2 kB.
--
-- The rules are the constraints' own, in the same words. A rule whose
-- test is NULL passes, as in a CHECK (NOT NULL is NULL, so its WHEN is
-- not taken). A broken rule raises check_violation under the name of the
-- constraint it replaces, so an error still says which rule it was.
--
-- NOT VALID, as several of the constraints it replaces were: every row
-- written since has been checked by the constraints dropped here, and
-- validating would hold the table's lock for a scan of it. New and
-- updated rows are checked as before. One transaction: the table is
-- never without its rules; the lock waits at most lock_timeout (run the
-- migration again if it times out).
SET LOCAL lock_timeout = '5s';

CREATE FUNCTION payment_events_check(
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
        WHEN NOT (network ~ '^[A-Z][A-Z0-9_]{0,63}$') THEN 'network_check'
        WHEN NOT (to_address ~ '^0x[0-9a-f]{40}$') THEN 'to_address_check'
        WHEN NOT (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') THEN 'traceparent_format'
        WHEN NOT (transfer_index ~ '^([0-9]{1,20}|native|trace:[A-Za-z0-9_]{1,96})$') THEN 'transfer_index_check'
        WHEN NOT (tx_hash ~ '^0x[0-9a-f]{64}$') THEN 'tx_hash_check'
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

ALTER TABLE payment_events
    DROP CONSTRAINT payment_events_event_id_check,
    DROP CONSTRAINT payment_events_event_type_check,
    DROP CONSTRAINT payment_events_status_check,
    DROP CONSTRAINT payment_events_outcome_check,
    DROP CONSTRAINT payment_events_retry_count_check,
    DROP CONSTRAINT payment_events_generation_check,
    DROP CONSTRAINT payment_events_content_hash_check,
    DROP CONSTRAINT payment_events_source_check,
    DROP CONSTRAINT payment_events_chain_state_check,
    DROP CONSTRAINT payment_events_hold_id_check,
    DROP CONSTRAINT payment_events_network_check,
    DROP CONSTRAINT payment_events_to_address_check,
    DROP CONSTRAINT payment_events_traceparent_format,
    DROP CONSTRAINT payment_events_transfer_index_check,
    DROP CONSTRAINT payment_events_tx_hash_check,
    DROP CONSTRAINT payment_events_amount_check,
    DROP CONSTRAINT payment_events_awaiting_has_check,
    DROP CONSTRAINT payment_events_hold_id_types,
    DROP CONSTRAINT payment_events_hold_outcomes,
    DROP CONSTRAINT payment_events_outcome_terminal,
    ADD CONSTRAINT payment_events_rules CHECK (payment_events_check(
        event_id, event_type, status, outcome, amount, retry_count, generation, content_hash, source,
        chain_state, next_check_at, hold_id, network, to_address, traceparent, transfer_index, tx_hash)) NOT VALID;
