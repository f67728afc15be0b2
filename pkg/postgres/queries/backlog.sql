-- name: backlog_settings
-- The backlog gauges are a scrape's worth of work, never a long read; and
-- never a sequential scan of payment_events, whose terminal rows dwarf
-- the live ones (a large backlog could tempt the planner).
SELECT set_config('statement_timeout', $1, true), set_config('enable_seqscan', 'off', true);

-- name: backlog_counts
-- Live events per status and network, and failed events with an open
-- dead letter. Each branch names its status literally (no COLLATE "C"), so
-- it reads only that status's partial index (payment_events_pending,
-- _enqueued, _processing, _awaiting; dead_letter_queue_open): terminal
-- events, however many, are never scanned. An event's network is its
-- asset's (assets is a handful of rows).
SELECT 'pending' AS status, COALESCE(e.network, a.network), count(*)
FROM payment_events e JOIN assets a ON a.code = e.asset
WHERE e.status = 'pending'
GROUP BY COALESCE(e.network, a.network)
UNION ALL
SELECT 'enqueued', COALESCE(e.network, a.network), count(*)
FROM payment_events e JOIN assets a ON a.code = e.asset
WHERE e.status = 'enqueued'
GROUP BY COALESCE(e.network, a.network)
UNION ALL
SELECT 'processing', COALESCE(e.network, a.network), count(*)
FROM payment_events e JOIN assets a ON a.code = e.asset
WHERE e.status = 'processing'
GROUP BY COALESCE(e.network, a.network)
UNION ALL
SELECT 'awaiting_finality', COALESCE(e.network, a.network), count(*)
FROM payment_events e JOIN assets a ON a.code = e.asset
WHERE e.status = 'awaiting_finality'
GROUP BY COALESCE(e.network, a.network)
UNION ALL
-- One event may have several open attempts: count events. The event is
-- found by its primary key (COLLATE "C" keeps the lookup there).
SELECT 'failed', COALESCE(e.network, a.network), count(DISTINCT d.event_id)
FROM dead_letter_queue d
JOIN payment_events e ON e.event_id = d.event_id AND e.status = 'failed' COLLATE "C"
JOIN assets a ON a.code = e.asset
WHERE d.resolution IS NULL
GROUP BY COALESCE(e.network, a.network);

-- name: backlog_oldest_pending
-- The oldest pending event's age, from the front of the pending index.
SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
FROM payment_events WHERE status = 'pending';
