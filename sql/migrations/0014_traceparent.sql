-- Tracing: the W3C traceparent of the span that stored the event, so the
-- scheduler's and the worker's spans continue the trace it began in the
-- api (or in the caller before it). NULL when the event was stored with
-- no trace (tracing off and no traceparent given, rows older than this).
-- A nullable column without a default: metadata only, no rewrite. The
-- CHECK is NOT VALID, so adding it scans nothing (every existing row is
-- NULL); it holds for every row written from now on.
ALTER TABLE payment_events ADD COLUMN traceparent text NULL;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_traceparent_format
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
