-- The operator console's reads (pkg/console). Every one finds its rows by
-- an index: the console is looked at during incidents, when the database
-- has the least to spare.

-- name: console_event_detail
-- The event row with the columns the story shows beyond get_event's.
SELECT event_id, event_type, user_id, asset, amount::text, status, retry_count, generation,
       COALESCE(tx_hash, ''), trace_id, source, COALESCE(related_event_id, ''),
       COALESCE(outcome, ''), COALESCE(error, ''), COALESCE(chain_state, ''),
       block_number, next_check_at, check_count, created_at, updated_at,
       COALESCE(task_id, ''), COALESCE(network, ''), COALESCE(hold_id, ''), COALESCE(to_address, ''),
       COALESCE(block_hash, ''), COALESCE(transfer_index, ''), receipt_seen_at, reopened_at, absent_since, absent_head,
       COALESCE(traceparent, '')
FROM payment_events
WHERE event_id = $1;

-- name: console_processed
-- The idempotency record, by its key (the primary key of every partition).
SELECT outcome, created_at, updated_at
FROM processed_events
WHERE idempotency_key = $1;

-- name: console_journal_of_event
-- Journal rows the event caused (UNIQUE (source_event_id, event_type)).
SELECT id, asset, amount::text, event_type, source_event_id, created_at
FROM balance_events
WHERE source_event_id = $1
ORDER BY id
LIMIT $2;

-- name: console_dlq_of_event
-- Every dead-letter attempt of the event (dead_letter_queue_event).
SELECT d.id, d.event_id, d.event_type, COALESCE(d.user_id, 0), COALESCE(d.asset, ''), COALESCE(d.amount::text, ''),
       d.error, d.attempt, d.generation, d.source, d.trace_id, d.created_at,
       COALESCE(d.resolution, ''), COALESCE(d.resolved_by, ''), d.resolved_at, COALESCE(d.resolution_reason, ''),
       COALESCE(e.status, ''), COALESCE(d.payload::text, '')
FROM dead_letter_queue d
LEFT JOIN payment_events e ON e.event_id = d.event_id
WHERE d.event_id = $1
ORDER BY d.id
LIMIT $2;

-- name: console_notifications_of_event
-- A notification's delivery_id is "<kind>:<event_id>" (unique), so the
-- event's are found by the ids its kinds give, with their attempts.
SELECT n.id, n.delivery_id, n.event_id, n.user_id, n.kind, n.status, n.attempts, n.next_attempt_at,
       COALESCE(n.last_error, ''), n.created_at, n.delivered_at, n.redeliveries,
       COALESCE(n.redelivery_requested_by, ''), n.redelivery_requested_at,
       COALESCE((
           SELECT json_agg(json_build_object(
                      'at', d.attempted_at, 'duration_ms', d.duration_ms,
                      'http_status', d.http_status, 'error_class', d.error_class) ORDER BY d.id DESC)
           FROM (SELECT * FROM notification_deliveries d
                 WHERE d.notification_id = n.id
                 ORDER BY d.id DESC LIMIT $2) d
       ), '[]')::text
FROM notification_outbox n
WHERE n.delivery_id = ANY($1::text[])
ORDER BY n.id;

-- name: console_claim_of_event
-- The on-chain transfer the event holds: a deposit's in chain_transfers,
-- a post's in payout_transfers (event_id is unique in each).
SELECT network, tx_hash, transfer_index, asset, COALESCE(block_hash, ''), log_position, created_at
FROM chain_transfers
WHERE event_id = $1
UNION ALL
SELECT network, tx_hash, transfer_index, asset, block_hash,
       CASE WHEN transfer LIKE 'log:%' THEN substr(transfer, 5)::integer END, created_at
FROM payout_transfers
WHERE event_id = $1
LIMIT 1;

-- name: console_dlq_open_count
-- Open entries, from the dead_letter_queue_open partial index.
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
FROM dead_letter_queue
WHERE resolution IS NULL;

-- name: console_recent_events
-- The newest events, walking payment_events_page backwards.
SELECT event_id, event_type, user_id, asset, amount::text, status, retry_count, generation,
       COALESCE(tx_hash, ''), trace_id, source, COALESCE(related_event_id, ''),
       COALESCE(outcome, ''), COALESCE(error, ''), COALESCE(chain_state, ''),
       block_number, next_check_at, check_count, created_at, updated_at
FROM payment_events
ORDER BY insert_xid DESC, event_id DESC
LIMIT $1;

-- name: console_events_of_user
-- A user's newest events, walking payment_events_user_page backwards.
SELECT event_id, event_type, user_id, asset, amount::text, status, retry_count, generation,
       COALESCE(tx_hash, ''), trace_id, source, COALESCE(related_event_id, ''),
       COALESCE(outcome, ''), COALESCE(error, ''), COALESCE(chain_state, ''),
       block_number, next_check_at, check_count, created_at, updated_at
FROM payment_events
WHERE user_id = $1
ORDER BY insert_xid DESC, event_id DESC
LIMIT $2;

-- name: console_search_settings
-- tx_hash has no index: a search by it is bounded in time, never a stall.
SELECT set_config('statement_timeout', $1, true);

-- name: console_events_of_tx
-- Events naming a transaction. Claims (the chain_transfers primary key,
-- by each network) come first and are always found; the scan of
-- payment_events runs under console_search_settings' timeout.
SELECT event_id, event_type, user_id, asset, amount::text, status, retry_count, generation,
       COALESCE(tx_hash, ''), trace_id, source, COALESCE(related_event_id, ''),
       COALESCE(outcome, ''), COALESCE(error, ''), COALESCE(chain_state, ''),
       block_number, next_check_at, check_count, created_at, updated_at
FROM payment_events
WHERE tx_hash = $1
ORDER BY created_at
LIMIT $2;

-- name: console_claims_of_tx
SELECT c.event_id
FROM chain_transfers c
WHERE c.network = ANY($1::text[]) AND c.tx_hash = $2
ORDER BY c.created_at
LIMIT $3;

-- name: console_networks
-- Every network name settle knows of: the assets' (a handful of rows).
SELECT DISTINCT network FROM assets ORDER BY network;

-- name: console_table_exists
SELECT to_regclass($1) IS NOT NULL;

-- name: console_chain_cursors
-- The scanners' cursors (migration 0013; the caller checks it exists).
SELECT network, next_block, updated_at, EXTRACT(EPOCH FROM now() - updated_at)::float8
FROM chain_cursors
ORDER BY network;

-- name: console_rescan_jobs
-- The newest rescan jobs (migration 0013; the caller checks it exists).
SELECT id, network, COALESCE(address, ''), from_block, to_block, next_block, status, COALESCE(error, ''),
       found, requested_by, COALESCE(operator, ''), created_at, updated_at,
       CASE WHEN status = 'running' THEN waiting_head END,
       restarts, last_restart_at, COALESCE(last_restart_reason, '')
FROM rescan_jobs
ORDER BY created_at DESC
LIMIT $1;

-- name: console_registered_networks
-- The networks table (migration 0012; the caller checks it exists).
SELECT name FROM networks ORDER BY name;
