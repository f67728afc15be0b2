-- The transition guard's WHEN clause as one array of the allowed
-- 'from>to' edges instead of twelve row comparisons. PostgreSQL reads a
-- trigger's WHEN back from its stored node tree for every statement that
-- changes status, and the twelve pairs stored as 11.7 kB of it (2.4 kB
-- now): about 20 us of PostgreSQL's CPU for a lone event's ledger update,
-- where the row test itself is the same handful of comparisons. The
-- edges are the same; TestDatabaseMirrorsTransitionTable checks every
-- pair against payment.CanTransition. In one transaction, so the table is
-- never without its guard; the lock waits at most lock_timeout (run the
-- migration again if it times out).
SET LOCAL lock_timeout = '5s';
DROP TRIGGER IF EXISTS payment_events_transition_guard ON payment_events;
CREATE TRIGGER payment_events_transition_guard BEFORE UPDATE OF status ON payment_events
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT (OLD.status || '>' || NEW.status) = ANY ('{
        pending>enqueued, pending>failed,
        enqueued>processing, enqueued>failed, enqueued>pending,
        enqueued>confirmed, enqueued>awaiting_finality,
        processing>confirmed, processing>failed,
        awaiting_finality>enqueued, awaiting_finality>failed,
        failed>pending}'::text[]))
    EXECUTE FUNCTION payment_events_refuse();
