-- Which providers reported each on-chain transfer, and when each first
-- did (CONTRACT.md, "More providers, side by side"): the event's source
-- says who was first; this says who else saw it and who missed it. One
-- row per event and reporter, at most a handful per event; rows older than
-- RETENTION are deleted with the notifications. No foreign key: a report
-- is observability, never a reason to make an insert wait on a lock.
CREATE TABLE transfer_reports (
    event_id text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 256),
    reporter text        NOT NULL CHECK (reporter ~ '^[a-z][a-z0-9_]{0,31}$'),
    first_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, reporter)
);
CREATE INDEX transfer_reports_first_at ON transfer_reports (first_at);
