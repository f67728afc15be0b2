-- name: run_stats
-- A load run's events (by id prefix): how many, how many terminal, by
-- outcome, and the accept-to-terminal latency percentiles in ms (the
-- terminal transition stamps updated_at).
SELECT count(*),
       count(*) FILTER (WHERE status IN ('confirmed', 'failed')),
       COALESCE(min(created_at), now()),
       COALESCE(max(updated_at) FILTER (WHERE status IN ('confirmed', 'failed')), now()),
       COALESCE(percentile_cont(0.50) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at) * 1000)
                FILTER (WHERE status IN ('confirmed', 'failed')), 0),
       COALESCE(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at) * 1000)
                FILTER (WHERE status IN ('confirmed', 'failed')), 0),
       COALESCE(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at) * 1000)
                FILTER (WHERE status IN ('confirmed', 'failed')), 0),
       COALESCE(max(extract(epoch FROM updated_at - created_at) * 1000)
                FILTER (WHERE status IN ('confirmed', 'failed')), 0)
FROM payment_events
WHERE event_id LIKE $1 || '%';

-- name: run_outcomes
SELECT COALESCE(outcome, status), count(*)
FROM payment_events
WHERE event_id LIKE $1 || '%'
GROUP BY 1;
