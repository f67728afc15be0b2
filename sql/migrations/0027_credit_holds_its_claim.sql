-- A deposit (or airdrop) that names a transaction may be confirmed only
-- with its transfer claim in chain_transfers, checked at commit. The
-- ledger always writes the two together; this makes the database refuse
-- any writer that does not, above all round one's workers still running
-- while an upgrade migrates under them (0007 backfilled only the claims
-- of deposits credited before it ran, so a credit by an old worker after
-- it held none, and a later report of the same transfer under its chain:
-- id was credited again). Such a worker's ledger transaction now fails
-- and its event reaches the DLQ, to be replayed by this version. Only a
-- change of status to confirmed of such a row is checked: the WHEN is
-- three comparisons, and a deposit without a transaction never queues the
-- check. Rows already stored are not checked (settlectl check does).
SET LOCAL lock_timeout = '5s';

CREATE FUNCTION payment_events_require_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM chain_transfers WHERE event_id = NEW.event_id) THEN
        RAISE EXCEPTION 'deposit % names transaction % but holds no transfer claim', NEW.event_id, NEW.tx_hash
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_events_credit_holds_claim',
                  HINT = 'every confirmed deposit with a tx_hash holds one chain_transfers row; a worker older than migration 0007 still running?';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER payment_events_credit_holds_claim
    AFTER INSERT OR UPDATE OF status ON payment_events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status = 'confirmed' AND NEW.tx_hash IS NOT NULL AND NEW.event_type IN ('deposit', 'airdrop'))
    EXECUTE FUNCTION payment_events_require_claim();
