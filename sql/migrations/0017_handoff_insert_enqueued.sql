-- The api's hand-off at a trickle inserts its rows 'enqueued' under their
-- task instead of inserting them 'pending' and updating them in the same
-- transaction (queries/events.sql, insert_events): the update wrote a
-- second tuple version into every index, re-ran the CHECKs and the
-- transition trigger, and cost WAL, for every event. The insert guard
-- admits that one other initial status, and only with a task id: an
-- 'enqueued' row without one would be recovered as a lost task at once.
-- Runs in one transaction, so the table is never without its guard.
-- DROP TRIGGER needs ACCESS EXCLUSIVE for a moment: it waits at most
-- lock_timeout rather than queue every writer behind a long reader; if it
-- times out, run the migration again.
SET LOCAL lock_timeout = '5s';
CREATE OR REPLACE FUNCTION payment_events_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'payment event % must be inserted as pending (or enqueued with a task id), not % (task id %)',
            NEW.event_id, NEW.status, COALESCE(NEW.task_id, 'none')
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'payment event %: transition % -> % is not allowed', NEW.event_id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
END;
$$;
DROP TRIGGER IF EXISTS payment_events_insert_guard ON payment_events;
CREATE TRIGGER payment_events_insert_guard BEFORE INSERT ON payment_events
    FOR EACH ROW WHEN (NEW.status <> 'pending' AND (NEW.status <> 'enqueued' OR COALESCE(NEW.task_id, '') = ''))
    EXECUTE FUNCTION payment_events_refuse();
