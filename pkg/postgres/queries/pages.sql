-- Keyset pages of events and of the journal, for integrators'
-- reconciliation (GET /v1/events, GET /v1/users/{id}/journal).
--
-- Order: the inserting transaction's id (insert_xid, migration 0010),
-- then the row's own key. A page shows only rows of transactions older
-- than every transaction still running (the statement snapshot's xmin):
-- a transaction in flight may commit a row later, and any order by time
-- or by a sequence would then put it before a cursor a reader has
-- passed. Every transaction that starts later has a larger id, so a row
-- that commits after a page sorts after it: paging to the end and on
-- from the last cursor later shows every row exactly once. A long write
-- transaction holds the tail back until it ends; rows from before 0010
-- have insert_xid 0 and come first.
--
-- Filters other than the user are applied to at most $scan rows in key
-- order, so a rare filter value costs a bounded scan per page: the page
-- may then hold fewer rows than asked for, with has_more and a cursor
-- past the rows scanned. The last row ("trailer") carries the key of
-- the last row scanned and how many were.

-- name: events_page
-- $1, $2: cursor (insert_xid, event_id); $3: rows to scan at most;
-- $4: status or NULL; $5: event_type or NULL; $6: page size + 1.
-- The event columns are get_event's (scanned by scanEventView).
WITH scanned AS MATERIALIZED (
    SELECT insert_xid, event_id,
           ($4::text IS NULL OR status = $4) AND ($5::text IS NULL OR event_type = $5) AS wanted
    FROM payment_events
    WHERE (insert_xid, event_id) > ($1::text::xid8, $2::text)
      AND insert_xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY insert_xid, event_id
    LIMIT $3
), page AS (
    SELECT event_id, row_number() OVER (ORDER BY insert_xid, event_id) AS n
    FROM (SELECT insert_xid, event_id FROM scanned WHERE wanted ORDER BY insert_xid, event_id LIMIT $6) w
), trailer AS (
    SELECT insert_xid, event_id, (SELECT count(*) FROM scanned) AS scanned_rows
    FROM scanned
    ORDER BY insert_xid DESC, event_id DESC
    LIMIT 1
)
SELECT * FROM (
    SELECT false AS trailer, page.n,
           e.event_id, e.event_type, e.user_id, e.asset, e.amount::text, e.status, e.retry_count, e.generation,
           COALESCE(e.tx_hash, ''), e.trace_id, e.source, COALESCE(e.related_event_id, ''),
           COALESCE(e.outcome, ''), COALESCE(e.error, ''), COALESCE(e.chain_state, ''),
           e.block_number, e.next_check_at, e.check_count, e.created_at, e.updated_at,
           e.insert_xid::text, 0::bigint AS scanned_rows
    FROM page JOIN payment_events e ON e.event_id = page.event_id
    UNION ALL
    SELECT true, 0, t.event_id, '', 0, '', '0', '', 0, 0, '', '', '', '', '', '', '',
           NULL, NULL, 0, now(), now(), t.insert_xid::text, t.scanned_rows
    FROM trailer t
) rows
ORDER BY trailer, n;

-- name: events_page_by_user
-- events_page for one user ($7), on payment_events_user_page.
WITH scanned AS MATERIALIZED (
    SELECT insert_xid, event_id,
           ($4::text IS NULL OR status = $4) AND ($5::text IS NULL OR event_type = $5) AS wanted
    FROM payment_events
    WHERE user_id = $7
      AND (insert_xid, event_id) > ($1::text::xid8, $2::text)
      AND insert_xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY insert_xid, event_id
    LIMIT $3
), page AS (
    SELECT event_id, row_number() OVER (ORDER BY insert_xid, event_id) AS n
    FROM (SELECT insert_xid, event_id FROM scanned WHERE wanted ORDER BY insert_xid, event_id LIMIT $6) w
), trailer AS (
    SELECT insert_xid, event_id, (SELECT count(*) FROM scanned) AS scanned_rows
    FROM scanned
    ORDER BY insert_xid DESC, event_id DESC
    LIMIT 1
)
SELECT * FROM (
    SELECT false AS trailer, page.n,
           e.event_id, e.event_type, e.user_id, e.asset, e.amount::text, e.status, e.retry_count, e.generation,
           COALESCE(e.tx_hash, ''), e.trace_id, e.source, COALESCE(e.related_event_id, ''),
           COALESCE(e.outcome, ''), COALESCE(e.error, ''), COALESCE(e.chain_state, ''),
           e.block_number, e.next_check_at, e.check_count, e.created_at, e.updated_at,
           e.insert_xid::text, 0::bigint AS scanned_rows
    FROM page JOIN payment_events e ON e.event_id = page.event_id
    UNION ALL
    SELECT true, 0, t.event_id, '', 0, '', '0', '', 0, 0, '', '', '', '', '', '', '',
           NULL, NULL, 0, now(), now(), t.insert_xid::text, t.scanned_rows
    FROM trailer t
) rows
ORDER BY trailer, n;

-- name: journal_page
-- $1: user; $2, $3: cursor (insert_xid, id); $4: rows to scan at most;
-- $5: asset or NULL; $6: page size + 1. On balance_events_user_page.
WITH scanned AS MATERIALIZED (
    SELECT id, insert_xid, user_id, asset, amount, event_type, source_event_id, created_at, network,
           ($5::text IS NULL OR asset = $5) AS wanted
    FROM balance_events
    WHERE user_id = $1
      AND (insert_xid, id) > ($2::text::xid8, $3::bigint)
      AND insert_xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY insert_xid, id
    LIMIT $4
), page AS (
    SELECT * FROM scanned WHERE wanted ORDER BY insert_xid, id LIMIT $6
), trailer AS (
    SELECT insert_xid, id, (SELECT count(*) FROM scanned) AS scanned_rows
    FROM scanned
    ORDER BY insert_xid DESC, id DESC
    LIMIT 1
)
SELECT * FROM (
    SELECT false AS trailer, p.insert_xid::text, p.id, p.asset, p.amount::text, p.event_type, p.source_event_id,
           p.created_at, 0::bigint AS scanned_rows, COALESCE(p.network, '') AS network
    FROM page p
    UNION ALL
    SELECT true, t.insert_xid::text, t.id, '', '0', '', '', now(), t.scanned_rows, ''
    FROM trailer t
) rows
ORDER BY trailer, insert_xid::xid8, id;
