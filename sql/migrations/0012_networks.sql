-- Networks: one deployment settles many EVM chains. CONTRACT.md,
-- "Networks". An asset code stays the ledger's unit (balances are per
-- user and code, fungible across networks); where and how a code lives on
-- each chain moves to network_assets, with each network's own decimals.

-- chain_id is what eth_chainId must answer for the network's RPC. It is
-- NULL only for a network carried over from round-one assets that settle
-- has no id for: a worker given an RPC for it refuses to start until an
-- operator sets one (settlectl networks add).
CREATE TABLE networks (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    chain_id     bigint      NULL UNIQUE CHECK (chain_id > 0),
    native_asset text        NULL REFERENCES assets (code),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- POL is Polygon's native coin; assets keeps one row per ledger code.
-- Its network, contract_address and decimals columns are the code's first
-- listing, kept as they were so rows written before this migration (whose
-- network was their asset's) still read; network_assets is the registry.
-- A round-one operator may have listed Polygon's coin by hand under
-- another code (MATIC): that row stays its native coin, and POL is not
-- added beside it.
INSERT INTO assets (code, network, contract_address, decimals) VALUES ('POL', 'MATIC_MAINNET', NULL, 18)
ON CONFLICT DO NOTHING;

INSERT INTO networks (name, chain_id, native_asset)
SELECT v.name, v.chain_id, COALESCE(a.code, v.native)
FROM (VALUES
    ('ETH_MAINNET',   1,        'ETH'),
    ('BASE_MAINNET',  8453,     'ETH'),
    ('ARB_MAINNET',   42161,    'ETH'),
    ('OPT_MAINNET',   10,       'ETH'),
    ('MATIC_MAINNET', 137,      'POL'),
    ('ETH_SEPOLIA',   11155111, 'ETH'),
    ('BASE_SEPOLIA',  84532,    'ETH')
) AS v (name, chain_id, native)
LEFT JOIN assets a ON a.network = v.name AND a.contract_address IS NULL;

-- Networks an operator put into assets by hand in round one.
INSERT INTO networks (name, native_asset)
SELECT DISTINCT ON (a.network) a.network, n.code
FROM assets a
LEFT JOIN assets n ON n.network = a.network AND n.contract_address IS NULL
WHERE NOT EXISTS (SELECT 1 FROM networks w WHERE w.name = a.network)
ORDER BY a.network;
INSERT INTO networks (name)
SELECT DISTINCT d.network FROM deposit_addresses d
WHERE NOT EXISTS (SELECT 1 FROM networks w WHERE w.name = d.network);

-- One row per code per network: the token's contract there (NULL for the
-- network's own coin) and its decimals there. A symbol never identifies a
-- token; (network, contract_address) does.
CREATE TABLE network_assets (
    network          text        NOT NULL REFERENCES networks (name),
    asset            text        NOT NULL REFERENCES assets (code),
    contract_address text        NULL CHECK (contract_address ~ '^0x[0-9a-f]{40}$'),
    decimals         smallint    NOT NULL CHECK (decimals BETWEEN 0 AND 18),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network, asset),
    UNIQUE (network, contract_address)
);
CREATE UNIQUE INDEX network_assets_native ON network_assets (network) WHERE contract_address IS NULL;

-- Everything round one knew, as it was.
INSERT INTO network_assets (network, asset, contract_address, decimals)
SELECT network, code, contract_address, decimals FROM assets;

-- The real contracts of USDC (native, Circle) and USDT on the mainnets,
-- Circle's test USDC on the Sepolias, and the native coins (POL too: a
-- round-one POL row may be its ERC-20 on Ethereum). A network's coin
-- already listed under another code is kept: the native index refuses a
-- second one, and the conflict skips the row.
INSERT INTO network_assets (network, asset, contract_address, decimals) VALUES
    ('BASE_MAINNET',  'ETH',  NULL, 18),
    ('BASE_MAINNET',  'USDC', '0x833589fcd6edb6e08f4c7c32d4f71b54bda02913', 6),
    ('BASE_MAINNET',  'USDT', '0xfde4c96c8593536e31f229ea8f37b2ada2699bb2', 6),
    ('ARB_MAINNET',   'ETH',  NULL, 18),
    ('ARB_MAINNET',   'USDC', '0xaf88d065e77c8cc2239327c5edb3a432268e5831', 6),
    ('ARB_MAINNET',   'USDT', '0xfd086bc7cd5c481dcc9c85ebe478a1c0b69fcbb9', 6),
    ('OPT_MAINNET',   'ETH',  NULL, 18),
    ('OPT_MAINNET',   'USDC', '0x0b2c639c533813f4aa9d7837caf62653d097ff85', 6),
    ('OPT_MAINNET',   'USDT', '0x94b008aa00579c1307b0ef2c499ad98a8ce58e58', 6),
    ('MATIC_MAINNET', 'POL',  NULL, 18),
    ('MATIC_MAINNET', 'USDC', '0x3c499c542cef5e3811e1192ce70d8cc03d5c3359', 6),
    ('MATIC_MAINNET', 'USDT', '0xc2132d05d31c914a87c6611c10748aeb04b58e8f', 6),
    ('ETH_SEPOLIA',   'ETH',  NULL, 18),
    ('ETH_SEPOLIA',   'USDC', '0x1c7d4b196cb0c7b01d743fbc6116a902379c7238', 6),
    ('BASE_SEPOLIA',  'ETH',  NULL, 18),
    ('BASE_SEPOLIA',  'USDC', '0x036cbd53842c5426634e7929541ec2318f3dcf7e', 6)
ON CONFLICT DO NOTHING;

-- A deposit address names a network settle knows. Every existing row's
-- network was inserted above, so validation finds nothing.
ALTER TABLE deposit_addresses ADD CONSTRAINT deposit_addresses_network_fkey
    FOREIGN KEY (network) REFERENCES networks (name) NOT VALID;
ALTER TABLE deposit_addresses VALIDATE CONSTRAINT deposit_addresses_network_fkey;

-- The journal says on which network each movement happened (NULL for rows
-- written before networks existed: their network is their asset's).
-- Nullable without a default: metadata only, no rewrite.
ALTER TABLE balance_events ADD COLUMN network text NULL CHECK (network ~ '^[A-Z][A-Z0-9_]{0,63}$');

-- Round one added an asset with one INSERT INTO assets; operators' scripts
-- that still do are listed on that network as well (the network is added,
-- without a chain id, if it is new).
CREATE FUNCTION assets_list_on_network() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO networks (name) VALUES (NEW.network) ON CONFLICT DO NOTHING;
    INSERT INTO network_assets (network, asset, contract_address, decimals)
    VALUES (NEW.network, NEW.code, NEW.contract_address, NEW.decimals)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER assets_list_on_network AFTER INSERT ON assets
    FOR EACH ROW EXECUTE FUNCTION assets_list_on_network();
