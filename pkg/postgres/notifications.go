package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/settle/settle/pkg/payment"
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
	// ClaimedUntil is the claim's lease end, its token: release and
	// failure records touch the row only while it still holds.
	ClaimedUntil time.Time
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
		err := row.Scan(&n.ID, &n.DeliveryID, &n.Kind, &payload, &attempts, &n.TraceID, &n.EventID, &n.UserID, &n.ClaimedUntil)
		n.Payload, n.Attempts = []byte(payload), int(attempts)
		return n, err
	})
	return out, classify(stmt.name, err)
}

// ReleaseNotifications gives back claimed notifications never posted:
// due now, their claim's attempt unspent; those another claim took since
// are left alone.
func (db *DB) ReleaseNotifications(ctx context.Context, unstarted []Notification) (int64, error) {
	stmt := q("notifications_release")
	ids := make([]int64, len(unstarted))
	claims := make([]time.Time, len(unstarted))
	for i, n := range unstarted {
		ids[i], claims[i] = n.ID, n.ClaimedUntil
	}
	tag, err := db.pool.Exec(ctx, stmt.text, ids, claims)
	return tag.RowsAffected(), classify(stmt.name, err)
}

// NotificationsDue reports whether any notification is due for delivery.
func (db *DB) NotificationsDue(ctx context.Context) (bool, error) {
	stmt := q("notifications_due")
	var due bool
	if err := db.pool.QueryRow(ctx, stmt.text).Scan(&due); err != nil {
		return false, classify(stmt.name, err)
	}
	return due, nil
}

// DeliveryAttempt is one POST of a notification, as the delivery log
// keeps it: an HTTP status or the class of a transport error, never a URL
// or a response body.
type DeliveryAttempt struct {
	At         time.Time     `json:"at"`
	Duration   time.Duration `json:"-"`
	DurationMS int64         `json:"duration_ms"`
	HTTPStatus int           `json:"http_status,omitempty"` // 0: no answer
	ErrorClass string        `json:"error_class,omitempty"` // "" when an answer came
}

func (a DeliveryAttempt) args() []any {
	var status, class any
	if a.HTTPStatus != 0 {
		status = a.HTTPStatus
	}
	if a.ErrorClass != "" {
		class = a.ErrorClass
	}
	return []any{a.At, max(a.Duration.Milliseconds(), 0), status, class}
}

// NotificationDelivered records a 2xx from the receiver and the attempt.
func (db *DB) NotificationDelivered(ctx context.Context, id int64, a DeliveryAttempt) error {
	stmt := q("notification_delivered")
	_, err := db.pool.Exec(ctx, stmt.text, append([]any{id}, a.args()...)...)
	return classify(stmt.name, err)
}

// NotificationFailed records a failed attempt: retry after retryIn, or give
// up for good when final. reason is stored as last_error: the caller keeps
// URLs and response bodies out of it. The attempt is logged always; the
// row moves only while n's claim still holds it.
//
// moved is false when the row was no longer this run's (another run
// claimed it after this run's lease ran out): the attempt is logged, the
// row left to its new claim.
func (db *DB) NotificationFailed(ctx context.Context, n Notification, a DeliveryAttempt, reason string, retryIn time.Duration, final bool) (moved bool, err error) {
	stmt := q("notification_failed")
	args := append([]any{n.ID}, a.args()...)
	tag, err := db.pool.Exec(ctx, stmt.text, append(args, reason, interval(retryIn), final, n.ClaimedUntil)...)
	if err != nil {
		return false, classify(stmt.name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Notification listing bounds.
const (
	NotificationPageMax     = 1000
	NotificationPageDefault = 100
	// NotificationAttemptsShown is how many of a notification's latest
	// attempts a listing carries.
	NotificationAttemptsShown = 20
)

// NotificationStates are the filters of Notifications.
var NotificationStates = []string{"pending", "delivered", "failed", "all"}

// NotificationView is an outbox row with its latest attempts, newest first.
type NotificationView struct {
	ID                    int64             `json:"id"`
	DeliveryID            string            `json:"delivery_id"`
	EventID               string            `json:"event_id"`
	UserID                int64             `json:"user_id"`
	Kind                  string            `json:"kind"`
	Status                string            `json:"status"`
	Attempts              int               `json:"attempts"`
	NextAttemptAt         time.Time         `json:"next_attempt_at"`
	LastError             string            `json:"last_error,omitempty"`
	CreatedAt             time.Time         `json:"created_at"`
	DeliveredAt           *time.Time        `json:"delivered_at,omitempty"`
	Redeliveries          int               `json:"redeliveries"`
	RedeliveryRequestedBy string            `json:"redelivery_requested_by,omitempty"`
	RedeliveryRequestedAt *time.Time        `json:"redelivery_requested_at,omitempty"`
	Log                   []DeliveryAttempt `json:"deliveries"`
}

// Notifications lists notifications in state ("pending", "delivered",
// "failed" or "all"), newest first, with ids below beforeID (0: from the
// newest); limit is capped at NotificationPageMax.
func (db *DB) Notifications(ctx context.Context, state string, beforeID int64, limit int) ([]NotificationView, error) {
	if !slices.Contains(NotificationStates, state) {
		return nil, fmt.Errorf("notification state %q: %w", state, payment.ErrInvalid)
	}
	if limit <= 0 {
		limit = NotificationPageDefault
	}
	limit = min(limit, NotificationPageMax)
	stmt := q("notifications_list")
	rows, err := db.pool.Query(ctx, stmt.text, state, beforeID, limit, NotificationAttemptsShown)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	out, err := pgx.CollectRows(rows, scanNotification)
	return out, classify(stmt.name, err)
}

// scanNotification reads notifications_list's columns (also the
// console's console_notifications_of_event).
func scanNotification(row pgx.CollectableRow) (NotificationView, error) {
	var v NotificationView
	var attempts, redeliveries int32
	var log string
	err := row.Scan(&v.ID, &v.DeliveryID, &v.EventID, &v.UserID, &v.Kind, &v.Status, &attempts, &v.NextAttemptAt,
		&v.LastError, &v.CreatedAt, &v.DeliveredAt, &redeliveries, &v.RedeliveryRequestedBy, &v.RedeliveryRequestedAt, &log)
	if err != nil {
		return v, err
	}
	v.Attempts, v.Redeliveries = int(attempts), int(redeliveries)
	if err := json.Unmarshal([]byte(log), &v.Log); err != nil {
		return v, fmt.Errorf("delivery log of notification %d: %w", v.ID, err)
	}
	for i := range v.Log {
		v.Log[i].Duration = time.Duration(v.Log[i].DurationMS) * time.Millisecond
	}
	return v, nil
}

// Redelivery results.
const (
	RedeliveryScheduled      = "scheduled"
	RedeliveryAlreadyPending = "already_pending"
)

// RedeliverNotification makes a settled notification due again, recording
// who asked; a pending one is left alone (already_pending), so asking
// twice sends once. payment.ErrNotFound when there is no such row.
func (db *DB) RedeliverNotification(ctx context.Context, id int64, who string) (string, error) {
	stmt := q("notification_redeliver")
	var previous string
	var moved bool
	err := db.pool.QueryRow(ctx, stmt.text, id, who).Scan(&previous, &moved)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("notification %d: %w", id, payment.ErrNotFound)
	}
	if err != nil {
		return "", classify(stmt.name, err)
	}
	if !moved {
		return RedeliveryAlreadyPending, nil
	}
	return RedeliveryScheduled, nil
}

// RedeliverFailedMax bounds one bulk redelivery: a caller repeats it
// while more remain.
const RedeliverFailedMax = 1000

// RedeliverFailedNotifications makes up to limit failed notifications
// due again (oldest first), each recording who asked, as
// RedeliverNotification does one; more reports that failed ones remain.
func (db *DB) RedeliverFailedNotifications(ctx context.Context, limit int, who string) (scheduled int64, more bool, err error) {
	if limit < 1 || limit > RedeliverFailedMax {
		return 0, false, payment.Invalid("a bulk redelivery takes 1..%d notifications, not %d", RedeliverFailedMax, limit)
	}
	stmt := q("notifications_redeliver_failed")
	err = db.pool.QueryRow(ctx, stmt.text, limit, who).Scan(&scheduled, &more)
	return scheduled, more, classify(stmt.name, err)
}
