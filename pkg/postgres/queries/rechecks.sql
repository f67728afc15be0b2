-- name: recheck_target
-- A deposit as a recheck asks the chain about it.
SELECT event_id, event_type, user_id, asset, amount::text, status, COALESCE(outcome, ''), COALESCE(error, ''),
       COALESCE(tx_hash, ''), COALESCE(transfer_index, ''), COALESCE(to_address, ''), trace_id, generation,
       COALESCE(network, (SELECT a.network FROM assets a WHERE a.code = payment_events.asset)), COALESCE(chain_state, '')
FROM payment_events
WHERE event_id = $1;

-- name: transfer_claims
-- Who holds the transfers of one transaction.
SELECT transfer_index, event_id, asset
FROM chain_transfers
WHERE network = $1 AND tx_hash = $2
ORDER BY transfer_index;

-- name: insert_recheck
INSERT INTO event_rechecks (event_id, requested_by, chain_state, result, detail)
VALUES ($1, $2, $3, $4, $5)
RETURNING id, created_at;

-- name: rechecks_of_event
SELECT id, event_id, requested_by, chain_state, result, detail, created_at
FROM event_rechecks
WHERE event_id = $1
ORDER BY id
LIMIT $2;

-- name: last_recheck_id
SELECT COALESCE(max(id), 0) FROM event_rechecks WHERE event_id = $1;

-- name: recheck_after
-- The first recheck of the event by $3 recorded after id $2, with the
-- event's status now.
SELECT r.id, r.event_id, r.requested_by, r.chain_state, r.result, r.detail, r.created_at, e.status
FROM event_rechecks r JOIN payment_events e ON e.event_id = r.event_id
WHERE r.event_id = $1 AND r.id > $2 AND r.requested_by = $3
ORDER BY r.id
LIMIT 1;
