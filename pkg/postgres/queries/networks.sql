-- name: list_networks
SELECT name, COALESCE(chain_id, 0), COALESCE(native_asset, '')
FROM networks
ORDER BY name;

-- name: list_network_assets
SELECT asset, network, COALESCE(contract_address, ''), decimals
FROM network_assets
ORDER BY network, asset;

-- name: lock_registry
-- Additions to the registry take turns: each checks what exists first.
SELECT pg_advisory_xact_lock(1398);

-- name: get_network
SELECT name, COALESCE(chain_id, 0), COALESCE(native_asset, '')
FROM networks
WHERE name = $1 OR chain_id = $2;

-- name: insert_asset_code
-- A ledger code's first listing also fills assets' legacy columns (see
-- migration 0012); a code that exists is left alone.
INSERT INTO assets (code, network, contract_address, decimals)
SELECT $1, $2, NULLIF($3, ''), $4
WHERE NOT EXISTS (SELECT 1 FROM assets WHERE code = $1)
  AND NOT EXISTS (SELECT 1 FROM assets WHERE network = $2 AND contract_address IS NOT DISTINCT FROM NULLIF($3, ''));

-- name: insert_network
INSERT INTO networks (name, chain_id, native_asset) VALUES ($1, $2, NULLIF($3, ''));

-- name: find_network_listing
SELECT asset, network, COALESCE(contract_address, ''), decimals
FROM network_assets
WHERE network = $1 AND (asset = $2 OR contract_address IS NOT DISTINCT FROM NULLIF($3, ''));

-- name: insert_network_asset
-- The trigger on assets may have listed it already, exactly so.
INSERT INTO network_assets (network, asset, contract_address, decimals) VALUES ($1, $2, NULLIF($3, ''), $4)
ON CONFLICT DO NOTHING;

-- name: set_network_native
UPDATE networks SET native_asset = $2 WHERE name = $1;

-- name: code_exists
SELECT EXISTS (SELECT 1 FROM assets WHERE code = $1);

-- name: report_rpcs
-- A worker has an RPC on these networks. A report younger than a minute
-- is left as it is, so replicas starting together write once.
INSERT INTO network_rpc_reports (network, reported_at)
SELECT unnest($1::text[]), now()
ON CONFLICT (network) DO UPDATE SET reported_at = now()
WHERE network_rpc_reports.reported_at < now() - interval '1 minute';

-- name: reported_rpcs
-- The networks a worker reported an RPC on within $1.
SELECT network FROM network_rpc_reports WHERE reported_at > now() - $1::interval;
