-- Invariant checks, each one statement on a shared REPEATABLE READ
-- snapshot, each returning (count, sample) so a report can be precise
-- without reading unbounded rows.

-- name: inv_balance_journal
-- 1. balance = initial_balance + SUM(balance_events.amount), per (user, asset).
SELECT count(*), COALESCE(string_agg(format('user %s %s: balance %s, initial %s + journal %s',
                                            user_id, asset, balance, initial_balance, journal), '; ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT b.user_id, b.asset, b.balance, b.initial_balance, COALESCE(j.total, 0) AS journal,
             row_number() OVER (ORDER BY b.user_id, b.asset) AS rn
      FROM balances b
      LEFT JOIN (SELECT user_id, asset, SUM(amount) AS total FROM balance_events GROUP BY user_id, asset) j
        ON j.user_id = b.user_id AND j.asset = b.asset
      WHERE b.balance <> b.initial_balance + COALESCE(j.total, 0)) bad;

-- name: inv_journal_orphans
-- Each journal row matches its event: same user, asset, and the amount
-- with the sign of the event type. A withdrawal_post journals as a
-- withdrawal (its amount is its hold's).
SELECT count(*), COALESCE(string_agg(source_event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT j.source_event_id, row_number() OVER (ORDER BY j.id) AS rn
      FROM balance_events j
      LEFT JOIN payment_events e ON e.event_id = j.source_event_id
                               AND j.event_type = CASE e.event_type WHEN 'withdrawal_post' THEN 'withdrawal' ELSE e.event_type END
      WHERE e.event_id IS NULL OR e.user_id <> j.user_id OR e.asset <> j.asset
         OR j.amount <> CASE WHEN e.event_type IN ('deposit', 'airdrop') THEN e.amount ELSE -e.amount END) bad;

-- name: inv_duplicate_journal
-- 2. At most one journal row per (source_event_id, event_type).
SELECT count(*), COALESCE(string_agg(source_event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT source_event_id, row_number() OVER (ORDER BY source_event_id) AS rn
      FROM balance_events GROUP BY source_event_id, event_type HAVING count(*) > 1) d;

-- name: inv_confirmed_without_journal
-- A confirmed event moved money exactly once (holds and voids move none).
SELECT count(*), COALESCE(string_agg(event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, row_number() OVER (ORDER BY e.created_at) AS rn FROM payment_events e
      WHERE e.status = 'confirmed' AND e.event_type NOT IN ('withdrawal_hold', 'withdrawal_void')
        AND NOT EXISTS (SELECT 1 FROM balance_events j WHERE j.source_event_id = e.event_id
                          AND j.event_type = CASE e.event_type WHEN 'withdrawal_post' THEN 'withdrawal' ELSE e.event_type END)) x;

-- name: inv_journal_without_confirmed
SELECT count(*), COALESCE(string_agg(source_event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT j.source_event_id, row_number() OVER (ORDER BY j.id) AS rn
      FROM balance_events j
      JOIN payment_events e ON e.event_id = j.source_event_id
                           AND j.event_type = CASE e.event_type WHEN 'withdrawal_post' THEN 'withdrawal' ELSE e.event_type END
      WHERE e.status <> 'confirmed') x;

-- name: inv_not_terminal
-- 3. Every accepted event ends confirmed or failed (checked when the
-- system is quiet: at the end of a run).
SELECT count(*), COALESCE(string_agg(event_id || '=' || status, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT event_id, status, row_number() OVER (ORDER BY created_at) AS rn
      FROM payment_events WHERE status NOT IN ('confirmed', 'failed')) x;

-- name: inv_failed_unexplained
-- A failed event has a DLQ row or a recorded business outcome. A
-- dead-lettered event's row is of its current generation (every writer
-- records the generation it failed, and only a reopen to pending bumps
-- it) and not replayed: a replayed row is an earlier failure's, whose
-- replay reopened the event. A discarded one still explains it (the
-- event stays failed).
SELECT count(*), COALESCE(string_agg(event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, row_number() OVER (ORDER BY e.created_at) AS rn FROM payment_events e
      WHERE e.status = 'failed'
        AND (e.outcome IS NULL
             OR e.outcome NOT IN ('insufficient_funds', 'reorged', 'reverted', 'not_found', 'mismatch', 'duplicate_transfer',
                                  'hold_closed', 'unknown_hold', 'dead_lettered')
             OR (e.outcome = 'dead_lettered'
                 AND NOT EXISTS (SELECT 1 FROM dead_letter_queue d
                                 WHERE d.event_id = e.event_id AND d.generation = e.generation
                                   AND d.resolution IS DISTINCT FROM 'replayed')))) x;

-- name: inv_processed_pending
-- No idempotency record stuck pending past the bound.
SELECT count(*), COALESCE(string_agg(event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT event_id, row_number() OVER (ORDER BY created_at) AS rn
      FROM processed_events WHERE outcome = 'pending' AND created_at < now() - $1::interval) x;

-- name: inv_dlq_unaccounted
-- An open DLQ entry names a stored event (or is the record of a task that
-- named none: source worker with a task type for an event type).
SELECT count(*), COALESCE(string_agg(id::text || ':' || event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT d.id, d.event_id, row_number() OVER (ORDER BY d.id) AS rn FROM dead_letter_queue d
      WHERE d.resolution IS NULL
        AND d.event_type IN ('deposit', 'airdrop', 'withdrawal', 'withdrawal_fee', 'reorg_compensation',
                             'withdrawal_hold', 'withdrawal_post', 'withdrawal_void')
        AND NOT EXISTS (SELECT 1 FROM payment_events e WHERE e.event_id = d.event_id)) d;

-- name: inv_transfer_claims
-- 5. Every chain_transfers row names exactly one confirmed deposit (or
-- airdrop) of that transaction (event_id is unique, so "one" is the
-- constraint's; this checks "confirmed deposit of that transaction").
SELECT count(*), COALESCE(string_agg(network || ':' || tx_hash || ':' || transfer_index || '=' || event_id, ', ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT t.network, t.tx_hash, t.transfer_index, t.event_id, row_number() OVER (ORDER BY t.created_at) AS rn
      FROM chain_transfers t
      LEFT JOIN payment_events e ON e.event_id = t.event_id
      LEFT JOIN assets a ON a.code = e.asset
      WHERE e.event_id IS NULL OR e.status <> 'confirmed' OR e.event_type NOT IN ('deposit', 'airdrop')
         OR e.tx_hash IS DISTINCT FROM t.tx_hash OR e.asset <> t.asset
         -- An event without a network predates networks: its network is
         -- its asset's, as the ledger reads it, or for an Alchemy id the
         -- one the id names, as migration 0007 claimed it.
         OR (t.network IS DISTINCT FROM COALESCE(e.network, a.network)
             AND NOT (e.network IS NULL AND e.event_id LIKE 'alchemy:%' AND t.network = split_part(e.event_id, ':', 2)))) x;

-- name: inv_payout_claims
-- Every payout_transfers row names a confirmed withdrawal_post of that
-- transaction, asset and network (event_id is unique: one transfer per
-- post, and the primary key: one post per transfer). A post's network is
-- its own, or its asset's when it names none, as the ledger claims it: a
-- claim on another network leaves the post's real transfer free for a
-- second post.
SELECT count(*), COALESCE(string_agg(network || ':' || tx_hash || ':' || transfer || '=' || event_id, ', ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT t.network, t.tx_hash, t.transfer, t.event_id, row_number() OVER (ORDER BY t.created_at) AS rn
      FROM payout_transfers t
      LEFT JOIN payment_events e ON e.event_id = t.event_id
      LEFT JOIN assets a ON a.code = e.asset
      WHERE e.event_id IS NULL OR e.status <> 'confirmed' OR e.event_type <> 'withdrawal_post'
         OR e.tx_hash IS DISTINCT FROM t.tx_hash OR e.asset <> t.asset
         OR t.network IS DISTINCT FROM COALESCE(e.network, a.network)) x;

-- name: inv_transfer_spellings
-- 5. One transfer, one claim: a trace index is lowercase. Migration 0021
-- moved every upper-case claim it could; one left has a lowercase twin,
-- a transfer credited twice, for a human to settle.
SELECT count(*), COALESCE(string_agg(network || ':' || tx_hash || ':' || transfer_index || '=' || event_id, ', ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT network, tx_hash, transfer_index, event_id, row_number() OVER (ORDER BY created_at) AS rn
      FROM chain_transfers
      WHERE transfer_index LIKE 'trace:%' AND transfer_index <> lower(transfer_index)) x;

-- name: inv_deposits_without_transfer
-- 5. Every confirmed deposit with a tx_hash holds exactly one transfer.
SELECT count(*), COALESCE(string_agg(event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, row_number() OVER (ORDER BY e.created_at) AS rn FROM payment_events e
      WHERE e.status = 'confirmed' AND e.event_type IN ('deposit', 'airdrop') AND e.tx_hash IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM chain_transfers t WHERE t.event_id = e.event_id)) x;

-- name: inv_open_holds
-- 4. SUM(open holds) <= balance per (user, asset), and balances.held, the
-- running sum the ledger keeps, equals it.
SELECT count(*), COALESCE(string_agg(format('user %s %s: balance %s, held %s, open holds %s',
                                            user_id, asset, balance, held, open), '; ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT b.user_id, b.asset, b.balance, b.held, COALESCE(h.total, 0) AS open,
             row_number() OVER (ORDER BY b.user_id, b.asset) AS rn
      FROM balances b
      LEFT JOIN (SELECT user_id, asset, SUM(amount) AS total FROM holds WHERE status = 'open' GROUP BY user_id, asset) h
        ON h.user_id = b.user_id AND h.asset = b.asset
      WHERE COALESCE(h.total, 0) > b.balance OR b.held <> COALESCE(h.total, 0)) bad;

-- name: inv_holds_without_balance
-- 4. An open hold belongs to a balance row (a hold of nobody's balance
-- would escape the check above).
SELECT count(*), COALESCE(string_agg(hold_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT h.hold_id, row_number() OVER (ORDER BY h.created_at) AS rn
      FROM holds h
      WHERE h.status = 'open'
        AND NOT EXISTS (SELECT 1 FROM balances b WHERE b.user_id = h.user_id AND b.asset = h.asset)) x;

-- name: inv_holds_match_events
-- Every hold row was opened by a confirmed withdrawal_hold of its user,
-- asset and amount, and a resolved one by a confirmed post or void of it,
-- of the same user, asset and amount: the journal checks hold a post to
-- its own row, so a post that debited another user, or less than the
-- hold paid out, shows only here.
SELECT count(*), COALESCE(string_agg(hold_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT h.hold_id, row_number() OVER (ORDER BY h.created_at) AS rn
      FROM holds h
      LEFT JOIN payment_events e ON e.event_id = h.hold_id AND e.event_type = 'withdrawal_hold'
      LEFT JOIN payment_events r ON r.event_id = h.resolved_by
      WHERE e.event_id IS NULL OR e.status <> 'confirmed' OR e.user_id <> h.user_id OR e.asset <> h.asset OR e.amount <> h.amount
         OR (h.status <> 'open' AND (r.event_id IS NULL OR r.status <> 'confirmed' OR r.hold_id IS DISTINCT FROM h.hold_id
                                     OR r.event_type <> CASE h.status WHEN 'posted' THEN 'withdrawal_post' ELSE 'withdrawal_void' END
                                     OR r.user_id <> h.user_id OR r.asset <> h.asset OR r.amount <> h.amount))) x;

-- name: inv_holds_of_confirmed
-- 4. A confirmed withdrawal_hold reserved its amount: it has its holds row
-- (open or resolved since). Without one, nothing is reserved and no post
-- can settle it.
SELECT count(*), COALESCE(string_agg(event_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, row_number() OVER (ORDER BY e.created_at) AS rn FROM payment_events e
      WHERE e.event_type = 'withdrawal_hold' AND e.status = 'confirmed'
        AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.hold_id = e.event_id)) x;

-- name: inv_hold_resolvers
-- 4. A confirmed post or void is what resolved its hold: the hold's
-- resolved_by names it and its status is the post's or void's. A post
-- whose hold stayed open debited money the hold still reserves.
SELECT count(*), COALESCE(string_agg(event_id || ' of ' || hold_id, ', ') FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, e.hold_id, row_number() OVER (ORDER BY e.created_at) AS rn FROM payment_events e
      LEFT JOIN holds h ON h.hold_id = e.hold_id
      WHERE e.event_type IN ('withdrawal_post', 'withdrawal_void') AND e.status = 'confirmed'
        AND (h.hold_id IS NULL OR h.resolved_by IS DISTINCT FROM e.event_id
             OR h.status <> CASE e.event_type WHEN 'withdrawal_post' THEN 'posted' ELSE 'voided' END)) x;

-- name: inv_post_networks
-- 4. A confirmed post is on its hold's network. The api copies the hold's
-- network onto the post, and the ledger checked the post's transaction
-- and claimed its transfer on the post's network: its own, or its
-- asset's when it names none (ledger_claim). A post on another network
-- settled the hold with a payment on a chain the hold does not pay out
-- on. A post whose hold has no row is inv_hold_resolvers' finding.
SELECT count(*), COALESCE(string_agg(format('%s on %s, hold %s on %s', event_id, COALESCE(network, 'none'), hold_id, hold_network), '; ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, COALESCE(e.network, a.network) AS network, h.hold_id, h.network AS hold_network,
             row_number() OVER (ORDER BY e.created_at) AS rn
      FROM payment_events e
      JOIN holds h ON h.hold_id = e.hold_id
      LEFT JOIN assets a ON a.code = e.asset
      WHERE e.event_type = 'withdrawal_post' AND e.status = 'confirmed'
        AND COALESCE(e.network, a.network) IS DISTINCT FROM h.network) x;

-- name: inv_void_networks
-- 4. A confirmed void names its hold's network, or none. A void moves no
-- money, so the ledger does not refuse one on another network, but the
-- api copies the hold's network onto it: another one means the void or
-- the hold was rewritten. A void naming none is not judged by its asset's
-- network (no chain is read or claimed for it).
SELECT count(*), COALESCE(string_agg(format('%s on %s, hold %s on %s', event_id, network, hold_id, hold_network), '; ')
                          FILTER (WHERE rn <= 10), '')
FROM (SELECT e.event_id, e.network, h.hold_id, h.network AS hold_network,
             row_number() OVER (ORDER BY e.created_at) AS rn
      FROM payment_events e
      JOIN holds h ON h.hold_id = e.hold_id
      WHERE e.event_type = 'withdrawal_void' AND e.status = 'confirmed'
        AND e.network IS NOT NULL AND e.network IS DISTINCT FROM h.network) x;

-- name: inv_hold_resolved_once
-- 4. A hold resolves once: at most one confirmed post or void names it.
SELECT count(*), COALESCE(string_agg(hold_id || ': ' || resolvers, '; ') FILTER (WHERE rn <= 10), '')
FROM (SELECT hold_id, string_agg(event_id, ', ' ORDER BY event_id) AS resolvers,
             row_number() OVER (ORDER BY hold_id) AS rn
      FROM payment_events
      WHERE event_type IN ('withdrawal_post', 'withdrawal_void') AND status = 'confirmed'
      GROUP BY hold_id HAVING count(*) > 1) x;

-- name: inv_reorg
-- The reorg cycles, three findings from one statement so that a cycle's
-- number is read from its event id in one place (r.n: NULL for an id
-- that is none of its deposit's cycle ids). Compensation n reverses the
-- deposit (n = 1, reorg:<d>) or give-back n-1 (reorg:return:<n-1>:<d>);
-- give-back n (return:<n>:<d>) reverses compensation n.
--
-- 1. A compensation or give-back (a credit of source reorg) names in
-- related_event_id the confirmed deposit it concerns, carries its user,
-- asset and amount, and has one of its cycle ids.
--
-- 2. A deposit is taken back at most once per reorg: its confirmed
-- compensations are cycles 1..c, its confirmed give-backs 1..b, and
-- c - b is 0 (on the chain) or 1 (off). Cancelled compensations and
-- voided give-backs ended failed and do not count.
--
-- 3. A confirmed deposit's chain_state says where its reorgs left it
-- (reorg.go and reorg_return.go write it in the transaction that makes,
-- cancels or voids the cycle's events; readReorgCycle's onChain). Off the
-- chain: its last compensation, cycle c, applied, waiting or
-- dead-lettered, is not cancelled (failed/reorged), and no give-back of
-- cycle c stands (confirmed, waiting or dead-lettered; a voided one does
-- not). Off the chain, chain_state is 'reorged', or 'watching' while the
-- watcher waits for its transfer, reported again, to be final. On the
-- chain (never compensated, compensation cancelled, or given back), it
-- is not 'reorged'. A compensated deposit marked otherwise is never given
-- back (a report of its transfer looks for 'reorged': lock_compensated).
WITH r AS (
    SELECT e.event_id, e.event_type = 'reorg_compensation' AS comp, e.status, COALESCE(e.outcome, '') AS outcome,
           e.user_id, e.asset, e.amount, e.related_event_id, e.created_at,
           CASE
               WHEN e.event_type = 'reorg_compensation' AND e.event_id = 'reorg:' || e.related_event_id THEN 1
               WHEN e.event_type = 'reorg_compensation' AND e.event_id = 'reorg:return:' || k.n || ':' || e.related_event_id THEN k.n + 1
               WHEN e.event_type = 'deposit' AND e.event_id = 'return:' || k.n || ':' || e.related_event_id THEN k.n
           END AS n
    FROM payment_events e
    CROSS JOIN LATERAL (SELECT (substring(e.event_id FROM '^(?:reorg:)?return:([0-9]{1,9}):'))::int AS n) k
    WHERE e.event_type = 'reorg_compensation' OR (e.event_type = 'deposit' AND e.source = 'reorg')
), matching AS (
    SELECT count(*) AS violations,
           COALESCE(string_agg(event_id || ' of ' || COALESCE(related_event_id, '?'), ', ') FILTER (WHERE rn <= 10), '') AS sample
    FROM (SELECT r.event_id, r.related_event_id, row_number() OVER (ORDER BY r.created_at) AS rn
          FROM r
          LEFT JOIN payment_events d ON d.event_id = r.related_event_id
          WHERE r.n IS NULL OR d.event_id IS NULL OR d.status <> 'confirmed' OR d.event_type NOT IN ('deposit', 'airdrop')
             OR d.user_id <> r.user_id OR d.asset <> r.asset OR d.amount <> r.amount) x
), per_deposit AS (
    SELECT related_event_id AS deposit,
           count(*) FILTER (WHERE comp) AS c, COALESCE(max(n) FILTER (WHERE comp), 0) AS c_max,
           count(*) FILTER (WHERE NOT comp) AS b, COALESCE(max(n) FILTER (WHERE NOT comp), 0) AS b_max
    FROM r
    WHERE status = 'confirmed' AND related_event_id IS NOT NULL
    GROUP BY related_event_id
), cycles AS (
    SELECT count(*) AS violations,
           COALESCE(string_agg(format('%s: %s compensation(s), %s give-back(s)', deposit, c, b), '; ')
                    FILTER (WHERE rn <= 10), '') AS sample
    FROM (SELECT deposit, c, b, row_number() OVER (ORDER BY deposit) AS rn
          FROM per_deposit
          WHERE c - b NOT IN (0, 1) OR c <> c_max OR b <> b_max) x
), last_cycle AS (
    -- Each deposit's last compensation, of any status (readReorgCycle's c).
    SELECT related_event_id AS deposit, max(n) AS c
    FROM r
    WHERE comp AND n IS NOT NULL
    GROUP BY related_event_id
), standing AS (
    SELECT l.deposit, l.c,
           COALESCE(bool_or(r.comp AND r.status = 'failed' AND r.outcome = 'reorged'), false) AS cancelled,
           COALESCE(bool_or(NOT r.comp AND (r.status <> 'failed' OR r.outcome = 'dead_lettered')), false) AS given_back
    FROM last_cycle l
    LEFT JOIN r ON r.related_event_id = l.deposit AND r.n = l.c
    GROUP BY l.deposit, l.c
), states AS (
    SELECT count(*) AS violations,
           COALESCE(string_agg(format('%s: chain_state %s, %s', event_id, COALESCE(chain_state, 'none'),
                                      CASE WHEN c IS NULL THEN 'never compensated'
                                           WHEN cancelled THEN format('compensation %s cancelled', c)
                                           WHEN given_back THEN format('compensation %s given back', c)
                                           ELSE format('compensation %s standing', c) END), '; ')
                    FILTER (WHERE rn <= 10), '') AS sample
    FROM (SELECT d.event_id, d.chain_state, s.c, s.cancelled, s.given_back,
                 row_number() OVER (ORDER BY d.created_at) AS rn
          FROM payment_events d
          LEFT JOIN standing s ON s.deposit = d.event_id
          CROSS JOIN LATERAL (SELECT s.c IS NOT NULL AND NOT s.cancelled AND NOT s.given_back AS off) o
          WHERE d.status = 'confirmed' AND d.event_type IN ('deposit', 'airdrop')
            AND (d.chain_state = 'reorged' OR s.deposit IS NOT NULL)
            AND CASE WHEN o.off THEN d.chain_state IS NULL OR d.chain_state NOT IN ('reorged', 'watching')
                     ELSE d.chain_state = 'reorged' END) x
)
SELECT m.violations, m.sample, c.violations, c.sample, s.violations, s.sample
FROM matching m, cycles c, states s;

-- name: inv_conservation
-- Money conservation per asset: SUM(balance) = SUM(initial) + confirmed
-- credits - confirmed debits, computed from the events, not the journal.
WITH per_asset AS (
    SELECT a.code AS asset,
           COALESCE((SELECT SUM(balance) FROM balances WHERE asset = a.code), 0) AS balances,
           COALESCE((SELECT SUM(initial_balance) FROM balances WHERE asset = a.code), 0) AS initial,
           COALESCE((SELECT SUM(amount) FROM payment_events WHERE asset = a.code AND status = 'confirmed'
                       AND event_type IN ('deposit', 'airdrop')), 0) AS credits,
           COALESCE((SELECT SUM(amount) FROM payment_events WHERE asset = a.code AND status = 'confirmed'
                       AND event_type IN ('withdrawal', 'withdrawal_fee', 'reorg_compensation', 'withdrawal_post')), 0) AS debits
    FROM assets a
)
SELECT asset, balances::text, initial::text, credits::text, debits::text
FROM per_asset
ORDER BY asset;

-- name: inv_conservation_networks
-- Conservation reported per (asset, network): confirmed credits and
-- debits by the network they moved on. An event's own network; a post
-- without one pays out on its hold's, a reorg compensation reverses its
-- deposit's; rows from before networks existed are their asset's first
-- network. Balances stay per asset (fungible across networks), so the
-- invariant is inv_conservation's; this says where the money came and went.
SELECT p.asset, COALESCE(p.network, h.network, r.network, a.network) AS network,
       COALESCE(SUM(p.amount) FILTER (WHERE p.event_type IN ('deposit', 'airdrop')), 0)::text AS credits,
       COALESCE(SUM(p.amount) FILTER (WHERE p.event_type IN ('withdrawal', 'withdrawal_fee', 'reorg_compensation', 'withdrawal_post')), 0)::text AS debits
FROM payment_events p
JOIN assets a ON a.code = p.asset
LEFT JOIN holds h ON h.hold_id = p.hold_id
LEFT JOIN payment_events r ON r.event_id = p.related_event_id
WHERE p.status = 'confirmed'
  AND p.event_type IN ('deposit', 'airdrop', 'withdrawal', 'withdrawal_fee', 'reorg_compensation', 'withdrawal_post')
GROUP BY 1, 2
ORDER BY 1, 2;
