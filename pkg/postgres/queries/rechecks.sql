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
