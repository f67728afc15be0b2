-- An internal transfer's index in its one spelling, lowercase
-- (payment.TraceTransfer). The scanner wrote 'trace:CALL_0_1' where
-- Alchemy writes 'trace:call_0_1', so one transfer could be claimed, and
-- credited, under both.
--
-- A claim moves to the lowercase spelling unless that one is held: then
-- the transfer was credited twice already, which no migration can undo.
-- Its upper-case claim stays as it is (moving it would fail on the
-- primary key) and the invariant checker reports it for a human. Of two
-- upper-case spellings of one index, the earlier claim moves.
--
-- An event's transfer_index follows its claim (an event whose claim
-- stays keeps its spelling with it); an event not yet credited is
-- rewritten, so its credit meets any claim already made. Event ids keep
-- their text: other tables name them.
SET LOCAL lock_timeout = '5s';

UPDATE chain_transfers t SET transfer_index = lower(t.transfer_index)
FROM (SELECT DISTINCT ON (network, tx_hash, lower(transfer_index)) network, tx_hash, transfer_index
      FROM chain_transfers
      WHERE transfer_index LIKE 'trace:%' AND transfer_index <> lower(transfer_index)
      ORDER BY network, tx_hash, lower(transfer_index), created_at, event_id) earliest
WHERE t.network = earliest.network AND t.tx_hash = earliest.tx_hash AND t.transfer_index = earliest.transfer_index
  AND NOT EXISTS (SELECT 1 FROM chain_transfers held
                  WHERE held.network = t.network AND held.tx_hash = t.tx_hash
                    AND held.transfer_index = lower(t.transfer_index));

UPDATE payment_events e SET transfer_index = lower(e.transfer_index)
WHERE e.transfer_index LIKE 'trace:%' AND e.transfer_index <> lower(e.transfer_index)
  AND NOT EXISTS (SELECT 1 FROM chain_transfers kept
                  WHERE kept.event_id = e.event_id AND kept.transfer_index = e.transfer_index);
