// Package notify delivers the user notifications the ledger wrote into
// notification_outbox, inside the same transaction as the money moved. A
// notification is sent at least once with a delivery id the receiver
// deduplicates on; it is retried with backoff and, if it never gets
// through, marked failed with an alert. A notification never touches the
// payment it describes: a failing receiver cannot put a payment in the DLQ.
package notify

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/postgres"
)

// Delivery bounds.
const (
	BatchMax        = 100
	Concurrency     = 8
	AttemptsMax     = 20
	RequestTimeout  = 5 * time.Second
	Lease           = time.Minute
	BackoffFirst    = 2 * time.Second
	BackoffMax      = time.Hour
	responseBodyMax = 1 << 10
)

// Store is the outbox.
type Store interface {
	ClaimNotifications(ctx context.Context, limit int, lease time.Duration) ([]postgres.Notification, error)
	NotificationDelivered(ctx context.Context, id int64) error
	NotificationFailed(ctx context.Context, id int64, reason string, retryIn time.Duration, final bool) error
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// Deliverer posts due notifications to one URL.
type Deliverer struct {
	store   Store
	url     string
	client  *http.Client
	log     zerolog.Logger
	alerts  Alerter
	results *prometheus.CounterVec
}

// New builds a deliverer; reg may be nil.
func New(store Store, url string, log zerolog.Logger, alerts Alerter, reg prometheus.Registerer) *Deliverer {
	d := &Deliverer{
		store: store, url: url, log: log, alerts: alerts,
		client: &http.Client{Timeout: RequestTimeout},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_notifications_total", Help: "Notification delivery attempts by result (delivered, retry, failed).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(d.results)
	}
	return d
}

// Deliver sends one batch of due notifications.
func (d *Deliverer) Deliver(ctx context.Context) error {
	due, err := d.store.ClaimNotifications(ctx, BatchMax, Lease)
	if err != nil {
		return err
	}
	slots := make(chan struct{}, Concurrency)
	var wg sync.WaitGroup
	for _, n := range due {
		slots <- struct{}{}
		wg.Add(1)
		go func(n postgres.Notification) {
			defer wg.Done()
			defer func() { <-slots }()
			d.deliverOne(ctx, n)
		}(n)
	}
	wg.Wait()
	return nil
}

func (d *Deliverer) deliverOne(ctx context.Context, n postgres.Notification) {
	log := d.log.With().Str("trace_id", n.TraceID).Str("event_id", n.EventID).Int64("user_id", n.UserID).
		Str("delivery_id", n.DeliveryID).Int("attempt", n.Attempts).Logger()
	err := d.post(ctx, n)
	if err == nil {
		d.results.WithLabelValues("delivered").Inc()
		if err := d.store.NotificationDelivered(ctx, n.ID); err != nil {
			// Delivered but not recorded: it will be sent again after the
			// lease, and the receiver deduplicates on the delivery id.
			log.Warn().Err(err).Msg("notification delivered but not recorded")
		}
		return
	}
	final := n.Attempts >= AttemptsMax
	retryIn := backoff(n.Attempts)
	if final {
		d.results.WithLabelValues("failed").Inc()
		d.alerts.Raise("notification_undeliverable", alert.Warning, "notification given up after every attempt", map[string]any{
			"delivery_id": n.DeliveryID, "event_id": n.EventID, "trace_id": n.TraceID, "error": err.Error(),
		})
	} else {
		d.results.WithLabelValues("retry").Inc()
	}
	log.Warn().Err(err).Bool("final", final).Dur("retry_in", retryIn).Msg("notification not delivered")
	if err := d.store.NotificationFailed(ctx, n.ID, err.Error(), retryIn, final); err != nil {
		log.Warn().Err(err).Msg("notification failure not recorded; the lease brings it back")
	}
}

func (d *Deliverer) post(ctx context.Context, n postgres.Notification) error {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(n.Payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Delivery-ID", n.DeliveryID)
	req.Header.Set("X-Request-ID", n.TraceID)
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, responseBodyMax))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("receiver answered %s", resp.Status)
	}
	return nil
}

// backoff is 2s·2^(attempt-1), capped at an hour.
func backoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 12 {
		return BackoffMax
	}
	return min(BackoffFirst<<(attempt-1), BackoffMax)
}
