-- The delivery log of user notifications: one row per attempt to POST a
-- notification, with what came back (an HTTP status, or the class of a
-- transport error) and how long it took. Never the URL, the response body
-- or an error text that could carry either. Rows go with their
-- notification (the daily cleanup deletes settled notifications).
CREATE TABLE notification_deliveries (
    id              bigserial   PRIMARY KEY,
    notification_id bigint      NOT NULL REFERENCES notification_outbox (id) ON DELETE CASCADE,
    attempted_at    timestamptz NOT NULL,
    duration_ms     integer     NOT NULL CHECK (duration_ms >= 0),
    http_status     integer     NULL CHECK (http_status BETWEEN 100 AND 599),
    error_class     text        NULL,
    CONSTRAINT notification_deliveries_result CHECK (http_status IS NOT NULL OR error_class IS NOT NULL)
);
CREATE INDEX notification_deliveries_notification ON notification_deliveries (notification_id, id);

-- Redelivery by an operator: who asked and when (the last request; every
-- attempt it causes is in the log above).
ALTER TABLE notification_outbox
    ADD COLUMN redeliveries             integer     NOT NULL DEFAULT 0,
    ADD COLUMN redelivery_requested_by  text        NULL,
    ADD COLUMN redelivery_requested_at  timestamptz NULL;

-- The admin listing pages newest first, optionally by status. The table
-- is bounded by the cleanup's retention, so the build is short.
CREATE INDEX notification_outbox_status_id ON notification_outbox (status, id);
