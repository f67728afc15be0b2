-- The enqueuer hands events to asynq in tasks of several events each.
-- Every claimed row remembers the id of the task that carries it, so
-- stale recovery can ask asynq about that task; a row claimed one by one
-- (or before this migration) has none and its task id is derived from its
-- idempotency key as before. Adding a nullable column is metadata only.
ALTER TABLE payment_events ADD COLUMN task_id text;

-- Numbers claims, so that task ids are never reused.
CREATE SEQUENCE settle_claim_seq;
