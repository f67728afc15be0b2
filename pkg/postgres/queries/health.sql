-- name: zombie_counts
-- Events stuck where they should only pass through (the seed's bounds:
-- processing > 5 min, pending or enqueued > 15 min), waiting deposits far
-- past their check time, DLQ entries of the last hour, and idempotency
-- records stuck pending. A pending event counts from when it became
-- pending (updated_at): recovery, a DLQ replay or a reopen sends an old
-- event back to the outbox, and counted from created_at it showed as
-- stuck until the enqueuer's next claim, raising zombie_pending for an
-- event just requeued. created_at <= updated_at, so the created_at bound
-- still lets the pending index narrow the count.
SELECT
    (SELECT count(*) FROM payment_events WHERE status = 'processing' AND updated_at < now() - $1::interval),
    (SELECT count(*) FROM payment_events WHERE status = 'pending' AND created_at < now() - $2::interval AND updated_at < now() - $2::interval),
    (SELECT count(*) FROM payment_events WHERE status = 'enqueued' AND updated_at < now() - $2::interval),
    (SELECT count(*) FROM payment_events WHERE status = 'awaiting_finality' AND next_check_at < now() - $2::interval),
    (SELECT count(*) FROM dead_letter_queue WHERE created_at > now() - interval '1 hour'),
    (SELECT count(*) FROM processed_events WHERE outcome = 'pending' AND created_at < now() - $3::interval),
    (SELECT count(*) FROM dead_letter_queue WHERE resolution IS NULL);
