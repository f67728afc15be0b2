-- name: hot_path_mismatches
-- Balances touched recently (a journal row, or any update of the row) that
-- differ from initial_balance + SUM(journal). Run on one REPEATABLE READ
-- snapshot so balance and journal are read at the same instant.
WITH recent AS (
    SELECT user_id, asset FROM balance_events WHERE created_at > now() - $1::interval
    UNION
    SELECT user_id, asset FROM balances WHERE updated_at > now() - $1::interval
)
SELECT b.user_id, b.asset, b.balance::text, b.initial_balance::text,
       COALESCE((SELECT SUM(j.amount) FROM balance_events j WHERE j.user_id = b.user_id AND j.asset = b.asset), 0)::text AS journal
FROM recent r
JOIN balances b ON b.user_id = r.user_id AND b.asset = r.asset
WHERE b.balance <> b.initial_balance
      + COALESCE((SELECT SUM(j.amount) FROM balance_events j WHERE j.user_id = b.user_id AND j.asset = b.asset), 0)
ORDER BY b.user_id, b.asset
LIMIT $2;

-- name: hot_path_checked
SELECT count(*) FROM (
    SELECT user_id, asset FROM balance_events WHERE created_at > now() - $1::interval
    UNION
    SELECT user_id, asset FROM balances WHERE updated_at > now() - $1::interval
) r;

-- name: reconcile_chunk
-- The next chunk of balances after the cursor, each with its journal sum.
SELECT b.user_id, b.asset, b.balance::text, b.initial_balance::text,
       COALESCE((SELECT SUM(j.amount) FROM balance_events j WHERE j.user_id = b.user_id AND j.asset = b.asset), 0)::text
FROM balances b
WHERE (b.user_id, b.asset) > ($1, $2)
ORDER BY b.user_id, b.asset
LIMIT $3;

-- name: reconcile_lock
-- Runs open or start a pass one at a time, so two runs that find none open
-- do not start two passes over the same balances.
SELECT pg_advisory_xact_lock(1399);

-- name: reconcile_open_run
SELECT id, cursor_user, cursor_asset, checked, mismatches, started_at
FROM reconcile_runs
WHERE finished_at IS NULL
ORDER BY started_at DESC
LIMIT 1;

-- name: reconcile_last_finished
SELECT COALESCE(max(finished_at), 'epoch'::timestamptz) FROM reconcile_runs WHERE finished_at IS NOT NULL;

-- name: reconcile_start
INSERT INTO reconcile_runs DEFAULT VALUES RETURNING id, started_at;

-- name: reconcile_advance
-- Records a chunk only if the pass's cursor is still where the chunk began
-- ($8, $9) and the pass is open: a run that another run of the same pass
-- overtook records nothing, so each balance is counted once per pass.
-- sample keeps the pass's first mismatches, unreported_sample the first
-- since the last report (all reported: this chunk's, whichever binary
-- reported them).
UPDATE reconcile_runs
SET cursor_user = $2, cursor_asset = $3, checked = checked + $4, mismatches = mismatches + $5,
    sample = CASE WHEN sample = '' THEN $6 ELSE sample END,
    unreported_sample = CASE
        WHEN $5 = 0 THEN unreported_sample
        WHEN unreported_sample = '' OR reported = mismatches THEN $6
        ELSE unreported_sample END,
    finished_at = CASE WHEN $7 THEN now() ELSE NULL END
WHERE id = $1 AND finished_at IS NULL AND cursor_user = $8 AND cursor_asset = $9
RETURNING checked, mismatches;

-- name: reconcile_pass
SELECT cursor_user, cursor_asset, checked, mismatches, finished_at IS NOT NULL
FROM reconcile_runs
WHERE id = $1;

-- name: reconcile_unreported
-- Passes with mismatches no scheduler has counted and alerted on yet
-- (settlectl records them without either). Locked, so two replicas
-- never report one twice. A row from before 0035 has no
-- unreported_sample: its first sample stands in.
SELECT id, mismatches - reported, COALESCE(NULLIF(unreported_sample, ''), sample)
FROM reconcile_runs
WHERE reported < mismatches
ORDER BY id
FOR UPDATE;

-- name: reconcile_mark_reported
UPDATE reconcile_runs SET reported = mismatches, unreported_sample = '' WHERE id = ANY($1::bigint[]);
