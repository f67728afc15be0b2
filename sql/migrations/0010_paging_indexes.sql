-- settle:no-transaction
-- Paging of events and of the journal (GET /v1/events, GET
-- /v1/users/{id}/journal) in insertion order: every row remembers the id
-- of the transaction that inserted it (queries/pages.sql says why that,
-- and not time or a sequence, is the order).
--
-- Safe on a big table. The column comes with a constant default, which
-- is metadata only (no rewrite; existing rows read 0), and in the same
-- statement the default of new rows becomes the inserting transaction's
-- id, so no row is inserted with 0 in between. Each ALTER needs ACCESS
-- EXCLUSIVE for a moment and waits for it at most lock_timeout, never
-- queueing every writer behind a long reader; if it times out, run the
-- migration again. The indexes are built concurrently. Every statement
-- is re-runnable; the migrator runs them one by one.
BEGIN;
SET LOCAL lock_timeout = '5s';
ALTER TABLE payment_events ADD COLUMN IF NOT EXISTS insert_xid xid8 NOT NULL DEFAULT '0',
    ALTER COLUMN insert_xid SET DEFAULT pg_current_xact_id();
ALTER TABLE balance_events ADD COLUMN IF NOT EXISTS insert_xid xid8 NOT NULL DEFAULT '0',
    ALTER COLUMN insert_xid SET DEFAULT pg_current_xact_id();
COMMIT;

-- GET /v1/events, and with user_id=; status and type filter the rows
-- these give.
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_events_page ON payment_events (insert_xid, event_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_events_user_page ON payment_events (user_id, insert_xid, event_id);
-- GET /v1/users/{id}/journal; asset filters the rows it gives.
CREATE INDEX CONCURRENTLY IF NOT EXISTS balance_events_user_page ON balance_events (user_id, insert_xid, id);
