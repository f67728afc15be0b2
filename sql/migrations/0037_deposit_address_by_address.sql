-- An EVM address is one key on every network: settle refuses to register
-- an address for a user when another user holds it on any network (the
-- primary key is per network). This index serves that lookup; rows that
-- already break the rule are left as they are.
SET LOCAL lock_timeout = '5s';

CREATE INDEX deposit_addresses_address ON deposit_addresses (address);
