package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification is an outbox row being delivered.
type Notification struct {
	ID         int64
	DeliveryID string
	Kind       string
	Payload    []byte
	Attempts   int
	TraceID    string
	EventID    string
	UserID     int64
}

// ClaimNotifications leases up to limit due notifications for lease.
func (db *DB) ClaimNotifications(ctx context.Context, limit int, lease time.Duration) ([]Notification, error) {
	stmt := q("notifications_claim")
	rows, err := db.pool.Query(ctx, stmt.text, limit, interval(lease))
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Notification, error) {
		var n Notification
		var payload string
		var attempts int32
		err := row.Scan(&n.ID, &n.DeliveryID, &n.Kind, &payload, &attempts, &n.TraceID, &n.EventID, &n.UserID)
		n.Payload, n.Attempts = []byte(payload), int(attempts)
		return n, err
	})
	return out, classify(stmt.name, err)
}

// NotificationDelivered records a 2xx from the receiver.
func (db *DB) NotificationDelivered(ctx context.Context, id int64) error {
	stmt := q("notification_delivered")
	_, err := db.pool.Exec(ctx, stmt.text, id)
	return classify(stmt.name, err)
}

// NotificationFailed records a failed attempt: retry after retryIn, or give
// up for good when final.
func (db *DB) NotificationFailed(ctx context.Context, id int64, reason string, retryIn time.Duration, final bool) error {
	stmt := q("notification_failed")
	_, err := db.pool.Exec(ctx, stmt.text, id, reason, interval(retryIn), final)
	return classify(stmt.name, err)
}
