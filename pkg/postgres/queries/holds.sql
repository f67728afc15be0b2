-- Holds (CONTRACT.md "Holds"): reads for the api and settlectl. The
-- ledger's own statements on holds are in ledger.sql.

-- name: hold_event
-- The withdrawal_hold event a post or void names, whatever its status:
-- the api takes the hold's asset, amount, network and recipient from it.
SELECT user_id, asset, amount::text, COALESCE(network, ''), COALESCE(to_address, '')
FROM payment_events
WHERE event_id = $1 AND event_type = 'withdrawal_hold';

-- name: get_hold
SELECT hold_id, user_id, asset, amount::text, network, COALESCE(to_address, ''), status,
       created_at, resolved_at, COALESCE(resolved_by, '')
FROM holds
WHERE hold_id = $1;

-- name: list_holds
-- Newest first, bounded; user and status filter when given (0 and '' mean
-- any).
SELECT hold_id, user_id, asset, amount::text, network, COALESCE(to_address, ''), status,
       created_at, resolved_at, COALESCE(resolved_by, '')
FROM holds
WHERE ($1::bigint = 0 OR user_id = $1) AND ($2::text = '' OR status = $2)
ORDER BY created_at DESC, hold_id
LIMIT $3;
