-- name: create_user
INSERT INTO users (id) VALUES ($1) ON CONFLICT (id) DO NOTHING;

-- name: user_exists
SELECT EXISTS (SELECT 1 FROM users WHERE id = $1);

-- name: set_initial_balance
-- Seeds a balance a user held before settle's journal began. Allowed only
-- while the journal has no row for that (user, asset): afterwards the
-- invariant balance = initial_balance + SUM(journal) would have to be
-- rewritten, which is a migration, not an operation.
-- The journal check sees this statement's snapshot, so a credit committed
-- while this waited for the row lock may be missed: the update therefore
-- never sets the balance, it moves balance and initial_balance by the
-- same delta on the row as locked, which keeps the invariant whatever
-- the ledger did meanwhile.
INSERT INTO balances (user_id, asset, balance, initial_balance)
SELECT $1, $2, $3::numeric, $3::numeric
WHERE NOT EXISTS (SELECT 1 FROM balance_events WHERE user_id = $1 AND asset = $2)
ON CONFLICT (user_id, asset) DO UPDATE
    SET balance = balances.balance + (EXCLUDED.initial_balance - balances.initial_balance),
        initial_balance = EXCLUDED.initial_balance, updated_at = now()
    WHERE NOT EXISTS (SELECT 1 FROM balance_events WHERE user_id = $1 AND asset = $2);

-- name: list_balances
-- balance and held from one row version: available is never computed
-- from two moments.
SELECT asset, balance::text, held::text
FROM balances
WHERE user_id = $1
ORDER BY asset;

-- name: lock_deposit_address
-- Registrations of one address take turns (their own key space), so two
-- users cannot take it on two networks at once.
SELECT pg_advisory_xact_lock(1399, hashtext($1));

-- name: other_owner_of_address
-- Another user holding the address on any network.
SELECT user_id, network FROM deposit_addresses WHERE address = $1 AND user_id <> $2 LIMIT 1;

-- name: insert_deposit_address
-- Returns the owner, whether just inserted or registered before.
WITH ins AS (
    INSERT INTO deposit_addresses (network, address, user_id)
    SELECT $1, $2, $3
    WHERE EXISTS (SELECT 1 FROM users WHERE id = $3)
    ON CONFLICT (network, address) DO NOTHING
    RETURNING user_id
)
SELECT
    (SELECT user_id FROM ins) AS inserted_user,
    (SELECT user_id FROM deposit_addresses WHERE network = $1 AND address = $2) AS existing_user,
    EXISTS (SELECT 1 FROM users WHERE id = $3) AS user_exists;

-- name: deposit_address_owners
-- Owners of the given addresses on one network, for the Alchemy webhook.
SELECT address, user_id
FROM deposit_addresses
WHERE network = $1 AND address = ANY($2::text[]);

-- name: user_has_deposit_address
SELECT EXISTS (SELECT 1 FROM deposit_addresses WHERE network = $1 AND user_id = $2);
