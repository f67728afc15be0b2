-- The chain scanner's cursors and rescan jobs (migration 0013). A pass
-- claims its range by lease and commits in a short transaction of its
-- own; no row lock is held while the chain is read.

-- name: scan_cursor_init
-- The first run of a network starts at the finality head: history nobody
-- asked for is never scanned. A concurrent first run keeps the first row.
INSERT INTO chain_cursors (network, next_block) VALUES ($1, $2)
ON CONFLICT (network) DO NOTHING;

-- name: scan_cursor_claim
-- Takes the network's cursor for one pass of at most $4 blocks ending at
-- or before the head $5, unless another scheduler holds a live lease.
-- Returns nothing when the lease is taken or the cursor is past the head.
UPDATE chain_cursors
SET lease_owner = $2, lease_until = now() + $3 * interval '1 millisecond',
    lease_to_block = LEAST(next_block + $4 - 1, $5)
WHERE network = $1
  AND next_block <= $5
  AND (lease_until IS NULL OR lease_until < now() OR lease_owner = $2)
RETURNING next_block, lease_to_block, COALESCE(last_hash, '');

-- name: scan_cursor_get
SELECT next_block, updated_at FROM chain_cursors WHERE network = $1;

-- name: scan_head_seed
-- When the network's head was last read, for a scanner starting; for a
-- network never read, when a scanner first followed it (now, unless one
-- did before), so that a restart while the node has never answered a
-- head still counts from the first start. Times are the database's:
-- a replica's clock running ahead would be kept, as the time never moves
-- back.
INSERT INTO scan_head_reads (network, started_at) VALUES ($1, now())
ON CONFLICT (network) DO UPDATE SET started_at = scan_head_reads.started_at
RETURNING COALESCE(read_at, started_at);

-- name: scan_head_read
-- A pass read the head now: recorded unless a read no older than $2 ms
-- is (any replica's), so the replicas write a network's row about once
-- an interval between them. Never moves the time back, except from the
-- database's future (a row an older version wrote from a clock ahead).
INSERT INTO scan_head_reads (network, started_at, read_at) VALUES ($1, now(), now())
ON CONFLICT (network) DO UPDATE SET read_at = EXCLUDED.read_at
WHERE scan_head_reads.read_at IS NULL
   OR scan_head_reads.read_at <= EXCLUDED.read_at - $2 * interval '1 millisecond'
   OR scan_head_reads.read_at > EXCLUDED.read_at;

-- name: scan_lock_network
-- A pass's networks ($1; one, in practice), locked before any row, in
-- key order: a pass touches only rows of its network's transactions (their
-- deposits, the deposits holding their claims, those deposits'
-- compensations), so a cursor pass and a rescan, or two rescans, of one
-- network queue here instead of each holding rows the other wants
-- (40P01). One lock a network, however many transfers a pass stores (a
-- lock per transaction would fill the shared lock table on a big pass).
-- Not the ledger's class 1397: the ledger takes that after event rows.
SELECT pg_advisory_xact_lock(1400, s.k)
FROM (SELECT DISTINCT hashtext(n) AS k FROM unnest($1::text[]) AS n ORDER BY 1) s;

-- name: scan_cursor_advance
-- Guarded by the block the pass started at and by its lease: a pass whose
-- lease another scheduler took over moves nothing (the other one scans
-- the same range and stores the same event ids).
UPDATE chain_cursors
SET next_block = $4 + 1, last_hash = NULLIF($5, ''), lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE network = $1 AND next_block = $3 AND lease_owner = $2
RETURNING next_block;

-- name: scan_cursor_rehash
-- A pass that found the block below its range replaced records the
-- chain's hash now (and asked for a rescan), so the next pass does not
-- ask again. Guarded by its lease.
UPDATE chain_cursors SET last_hash = $4
WHERE network = $1 AND lease_owner = $2 AND next_block = $3;

-- name: scan_cursor_release
-- A failed pass gives its lease back at once, so the next pass (here or
-- elsewhere) does not wait out the lease.
UPDATE chain_cursors SET lease_owner = NULL, lease_until = NULL
WHERE network = $1 AND lease_owner = $2;

-- name: scan_addresses_page
-- One page of a network's deposit addresses, in address order (the
-- primary key), after $2.
SELECT address, user_id
FROM deposit_addresses
WHERE network = $1 AND address > $2
ORDER BY address
LIMIT $3;

-- name: scan_address_owner
SELECT user_id FROM deposit_addresses WHERE network = $1 AND address = $2;

-- name: scan_backfill_from
UPDATE deposit_addresses SET from_block = $3
WHERE network = $1 AND address = $2;

-- name: rescan_insert
-- A backfill ($6 = 'backfill') is inserted with its end pending.
INSERT INTO rescan_jobs (id, network, address, from_block, to_block, next_block, requested_by, end_pending, operator)
VALUES ($1, $2, $3, $4, $5, $4, $6, $6 = 'backfill', $7)
RETURNING created_at;

-- name: rescan_get
SELECT id, network, COALESCE(address, ''), from_block, to_block, end_pending, next_block, status, COALESCE(error, ''),
       found, requested_by, COALESCE(operator, ''), created_at, updated_at,
       CASE WHEN status = 'running' THEN waiting_head END,
       restarts, last_restart_at, COALESCE(last_restart_reason, '')
FROM rescan_jobs
WHERE id = $1;

-- name: rescan_resolve_backfills
-- A backfill ends where the cursor's passes see the address: every pass
-- claimed after the address was registered loads it, so the blocks left
-- are those already scanned (next_block - 1) and those of a claimed range
-- (lease_to_block). A backfill starting past that is already covered.
UPDATE rescan_jobs j
SET to_block = GREATEST(c.next_block - 1, COALESCE(c.lease_to_block, -1), j.from_block - 1),
    end_pending = false,
    status = CASE WHEN GREATEST(c.next_block - 1, COALESCE(c.lease_to_block, -1)) < j.from_block THEN 'done' ELSE 'running' END,
    updated_at = now()
FROM chain_cursors c
WHERE c.network = j.network
  AND j.network = ANY($1::text[])
  AND j.status = 'running' AND j.end_pending;

-- name: rescan_networks
-- The networks among $1 with a job the scanner may claim, so that a tick
-- reads no head for a network without one.
SELECT DISTINCT network FROM rescan_jobs
WHERE status = 'running' AND NOT end_pending AND network = ANY($1::text[])
ORDER BY network;

-- name: rescan_mark_waiting
-- Records on network $1's running jobs whether they wait for the chain:
-- waiting_head is the finality head $2 just read when next_block is above
-- it, else NULL. Answers how many wait.
WITH marked AS (
    UPDATE rescan_jobs
    SET waiting_head = CASE WHEN next_block > $2::bigint THEN $2::bigint END
    WHERE network = $1 AND status = 'running' AND NOT end_pending
      AND waiting_head IS DISTINCT FROM (CASE WHEN next_block > $2::bigint THEN $2::bigint END)
)
SELECT count(*) FROM rescan_jobs
WHERE network = $1 AND status = 'running' AND NOT end_pending AND next_block > $2::bigint;

-- name: rescan_claim
-- A running job of network $1 whose lease is free and whose next block is
-- at or below the finality head $4: one above it waits without holding
-- the others back. Jobs take turns: the one whose last pass (updated_at)
-- is oldest goes first, so a long backfill or rescan never holds back a
-- later one, such as the scanner's own after a reorg.
UPDATE rescan_jobs
SET lease_owner = $2, lease_until = now() + $3 * interval '1 millisecond'
WHERE id = (
    SELECT id FROM rescan_jobs
    WHERE status = 'running' AND NOT end_pending AND network = $1 AND next_block <= $4
      AND (lease_until IS NULL OR lease_until < now())
    ORDER BY updated_at, created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING id, network, COALESCE(address, ''), next_block, to_block, COALESCE(last_hash, '');

-- name: rescan_advance
-- Guarded like scan_cursor_advance; done once next_block passes to_block.
-- $6 is the hash of block $4 as the pass read it ('' under finalized),
-- which the job's next pass links to. $5 are the event ids the pass
-- found and $7 their blocks: found grows by those the job had not found
-- before (a restart reads blocks again), recorded in rescan_found while
-- the job runs (rescan_found_prune drops those no restart reads again).
-- A pass that lost its lease rolls the recording back with the rest.
WITH new AS (
    INSERT INTO rescan_found (job_id, event_id, block_number)
    SELECT $1, f.id, f.block FROM unnest($5::text[], $7::bigint[]) AS f(id, block)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
UPDATE rescan_jobs
SET next_block = $4 + 1, found = found + (SELECT count(*) FROM new), last_hash = NULLIF($6, ''),
    status = CASE WHEN $4 >= to_block THEN 'done' ELSE 'running' END,
    lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND next_block = $3 AND lease_owner = $2 AND status = 'running'
RETURNING status;

-- name: rescan_found_forget
-- A job that ended (done, or cancelled): its found is final, and the ids
-- that counted it go.
DELETE FROM rescan_found WHERE job_id = $1;

-- name: rescan_found_prune
-- A running job's pass forgets the ids found below block $2, where a
-- restart at its next pass would go back to (rescanFoundFloor). Rows of
-- an older binary (no block) stay until the job ends. Run after rescan_advance, in its transaction: a CTE of
-- it would not see the rows it inserted.
DELETE FROM rescan_found WHERE job_id = $1 AND block_number < $2;

-- name: rescan_restart
-- A pass found its first block's parent is not the block the job's pass
-- before read last: the branch changed under the job, so the blocks it
-- read may be the other branch's. The job goes back $4 blocks (the whole
-- range when $4 is not positive), never before from_block, with no hash
-- to link to, and gives its lease back. Guarded like rescan_advance.
-- The restart is recorded on the job: counted, when, and why ($5, to
-- which the block the job goes back to is added).
UPDATE rescan_jobs
SET next_block = CASE WHEN $4::bigint > 0 THEN GREATEST(from_block, $3 - $4::bigint) ELSE from_block END,
    last_hash = NULL, waiting_head = NULL, lease_owner = NULL, lease_until = NULL, updated_at = now(),
    restarts = restarts + 1, last_restart_at = now(),
    last_restart_reason = $5::text || '; reading again from block '
        || CASE WHEN $4::bigint > 0 THEN GREATEST(from_block, $3 - $4::bigint) ELSE from_block END
WHERE id = $1 AND next_block = $3 AND lease_owner = $2 AND status = 'running'
RETURNING next_block;

-- name: rescan_release
-- A pass that failed gives its job back, to the back of its network's
-- turns: a job failing for reasons of its own (a block its node cannot
-- serve) would otherwise be claimed first on every pass.
UPDATE rescan_jobs SET lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND lease_owner = $2;

-- name: rescan_fail
-- The ids that counted found go with the job's end.
WITH failed AS (
    UPDATE rescan_jobs
    SET status = 'failed', error = $3, lease_owner = NULL, lease_until = NULL, updated_at = now()
    WHERE id = $1 AND lease_owner = $2 AND status = 'running'
    RETURNING id
)
DELETE FROM rescan_found WHERE job_id IN (SELECT id FROM failed);

-- name: rescan_cancel
-- An operator ends a running job: failed, saying who and why. A pass
-- under way stores nothing (its advance wants the job running). Answers
-- whether it was cancelled and whether job $1 exists at all, so that an
-- unknown id and a job that already ended are told apart.
WITH cancelled AS (
    UPDATE rescan_jobs
    SET status = 'failed', error = $2, end_pending = false, lease_owner = NULL, lease_until = NULL, updated_at = now()
    WHERE id = $1 AND status = 'running'
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM cancelled), EXISTS (SELECT 1 FROM rescan_jobs WHERE id = $1);
