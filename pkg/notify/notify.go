// Package notify delivers the user notifications the ledger wrote into
// notification_outbox, inside the same transaction as the money moved. A
// notification is sent at least once with a delivery id the receiver
// deduplicates on; it is retried with backoff and, if it never gets
// through, marked failed with an alert. A notification never touches the
// payment it describes: a failing receiver cannot put a payment in the DLQ.
//
// Every POST is signed the Standard Webhooks way (signature.go) and every
// attempt is kept in the delivery log (notification_deliveries): when, how
// long, and the HTTP status or the class of the transport error. Neither
// the log, last_error nor a log line ever holds the URL: its path is often
// the receiver's secret.
package notify

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/tracing"
)

// Delivery bounds.
const (
	BatchMax       = 100
	Concurrency    = 8
	AttemptsMax    = 20
	RequestTimeout = 5 * time.Second
	// Lease is how long a claimed batch is this run's; a POST starts only
	// if it and its record end within it (Deliver), so no other run can
	// claim a notification while it is being sent. A run paused past it
	// (GC, SIGSTOP) may lose its rows to another claim: its failure and
	// release records then leave them alone (ClaimedUntil).
	Lease = time.Minute
	// TaskTimeout is the delivery task's bound (the scheduler's asynq
	// timeout): the lease, which Deliver keeps to.
	TaskTimeout     = Lease
	BackoffFirst    = 2 * time.Second
	BackoffMax      = time.Hour
	responseBodyMax = 1 << 10
	recordTimeout   = 5 * time.Second
)

// Store is the outbox.
type Store interface {
	ClaimNotifications(ctx context.Context, limit int, lease time.Duration) ([]postgres.Notification, error)
	NotificationDelivered(ctx context.Context, id int64, attempt postgres.DeliveryAttempt) error
	NotificationFailed(ctx context.Context, n postgres.Notification, attempt postgres.DeliveryAttempt, reason string, retryIn time.Duration, final bool) (bool, error)
	ReleaseNotifications(ctx context.Context, unstarted []postgres.Notification) (int64, error)
}

// Alerter tells a human.
type Alerter interface {
	Raise(key string, severity alert.Severity, summary string, fields map[string]any)
}

// Deliverer posts due notifications to one URL.
type Deliverer struct {
	store          Store
	url            string
	key            []byte
	now            func() time.Time
	requestTimeout time.Duration
	client         *http.Client
	log            zerolog.Logger
	alerts         Alerter
	results        *prometheus.CounterVec
	// running: a run takes up to the lease while the scheduler enqueues
	// one every NOTIFY_INTERVAL; runs side by side would fill the
	// worker's slots (the payments' too) while a receiver is slow.
	running atomic.Bool
}

// New builds a deliverer signing with key (ParseSecret); reg may be nil.
func New(store Store, url string, key []byte, log zerolog.Logger, alerts Alerter, reg prometheus.Registerer) *Deliverer {
	d := &Deliverer{
		store: store, url: url, key: key, now: time.Now, requestTimeout: RequestTimeout,
		log: log.With().Str("receiver", logging.URL(url)).Logger(), alerts: alerts,
		client: &http.Client{
			Timeout: RequestTimeout,
			// A redirect is a failed delivery: following it would re-send
			// a POST as a GET, to a URL nobody configured.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_notifications_total", Help: "Notification delivery attempts by result (delivered, retry, failed).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(d.results)
	}
	// Every result's series exists at 0 from the start, so
	// SettleNotificationsUndeliverable's increase() sees the first failure.
	for _, result := range []string{"delivered", "retry", "failed"} {
		d.results.WithLabelValues(result)
	}
	return d
}

// Deliver sends one batch of due notifications, one run at a time: a
// call while another runs returns at once, the running one delivering.
// A POST starts only while ctx is live and it and its record can end
// before ctx's deadline and the lease, so no deadline cuts off an answer
// the receiver gives within RequestTimeout; the rows it does not start
// are given back at once, due again with their attempt unspent.
func (d *Deliverer) Deliver(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return nil
	}
	defer d.running.Store(false)
	claimedAt := d.now() // the lease starts after this
	due, err := d.store.ClaimNotifications(ctx, BatchMax, Lease)
	if err != nil {
		return err
	}
	startBy := claimedAt.Add(Lease)
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(startBy) {
		startBy = deadline
	}
	startBy = startBy.Add(-d.requestTimeout - recordTimeout)
	slots := make(chan struct{}, Concurrency)
	var wg sync.WaitGroup
	for i, n := range due {
		slots <- struct{}{}
		if ctx.Err() != nil || d.now().After(startBy) {
			<-slots
			d.release(ctx, due[i:])
			break
		}
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

// release gives back claimed notifications never posted.
func (d *Deliverer) release(ctx context.Context, unstarted []postgres.Notification) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	released, err := d.store.ReleaseNotifications(ctx, unstarted)
	if err != nil {
		// They wait out the lease, having spent an attempt.
		d.log.Warn().Err(logging.RedactError(err)).Int("notifications", len(unstarted)).Msg("unsent notifications not released; due again after the lease")
		return
	}
	d.log.Info().Int64("released", released).Msg("notifications left unsent for lack of time given back")
}

func (d *Deliverer) deliverOne(ctx context.Context, n postgres.Notification) {
	log := d.log.With().Str("trace_id", n.TraceID).Str("event_id", n.EventID).Int64("user_id", n.UserID).
		Str("delivery_id", n.DeliveryID).Int("attempt", n.Attempts).Logger()
	// In the event's trace (the row keeps its trace_id, not a span).
	ctx, span := tracing.Start(tracing.ForEvent(ctx, "", n.TraceID), "notify.deliver", tracing.Client)
	attempt := d.post(ctx, n)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("settle.event_id", n.EventID), attribute.String("settle.delivery_id", n.DeliveryID),
			attribute.Int("settle.attempt", n.Attempts), attribute.Int("http.response.status_code", attempt.HTTPStatus))
		if attempt.HTTPStatus/100 != 2 {
			span.SetStatus(codes.Error, failureReason(attempt))
		}
	}
	span.End()
	// The attempt happened: record it even when ctx ended meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if attempt.HTTPStatus/100 == 2 {
		d.results.WithLabelValues("delivered").Inc()
		if err := d.store.NotificationDelivered(ctx, n.ID, attempt); err != nil {
			// Delivered but not recorded: it will be sent again after the
			// lease, and the receiver deduplicates on the delivery id.
			log.Warn().Err(logging.RedactError(err)).Msg("notification delivered but not recorded")
		}
		return
	}
	reason := failureReason(attempt)
	final := n.Attempts >= AttemptsMax
	retryIn := backoff(n.Attempts)
	log.Warn().Str("error", reason).Int("http_status", attempt.HTTPStatus).Str("error_class", attempt.ErrorClass).
		Bool("final", final).Dur("retry_in", retryIn).Msg("notification not delivered")
	moved, err := d.store.NotificationFailed(ctx, n, attempt, reason, retryIn, final)
	switch {
	case err != nil:
		log.Warn().Err(logging.RedactError(err)).Msg("notification failure not recorded; the lease brings it back")
	case !moved:
		// Another run holds it now (this one was paused past its lease):
		// its fate is that run's, so nothing is given up here.
		final = false
		log.Info().Msg("notification claimed by another run meanwhile; its failure here is only logged")
	}
	if final {
		d.results.WithLabelValues("failed").Inc()
		d.alerts.Raise("notification_undeliverable", alert.Warning, "notification given up after every attempt", map[string]any{
			"delivery_id": n.DeliveryID, "event_id": n.EventID, "trace_id": n.TraceID, "error": reason,
		})
	} else {
		d.results.WithLabelValues("retry").Inc()
	}
}

// failureReason is last_error: the status or the error class, nothing the
// receiver or the URL could have put there.
func failureReason(a postgres.DeliveryAttempt) string {
	if a.HTTPStatus != 0 {
		return "receiver answered HTTP " + strconv.Itoa(a.HTTPStatus)
	}
	return "not delivered: " + a.ErrorClass
}

// post sends one signed notification and says what happened.
func (d *Deliverer) post(ctx context.Context, n postgres.Notification) postgres.DeliveryAttempt {
	start := d.now()
	attempt := postgres.DeliveryAttempt{At: start}
	status, err := d.send(ctx, n, start)
	attempt.Duration = d.now().Sub(start)
	attempt.HTTPStatus = status
	if err != nil {
		attempt.ErrorClass = ErrorClass(err)
	}
	return attempt
}

func (d *Deliverer) send(ctx context.Context, n postgres.Notification, at time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, d.requestTimeout)
	defer cancel()
	body := withSequence(n.Payload, n.ID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderID, n.DeliveryID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(HeaderSignature, Sign(d.key, n.DeliveryID, at, body))
	req.Header.Set("X-Delivery-ID", n.DeliveryID)
	req.Header.Set("X-Request-ID", n.TraceID)
	if traceparent := tracing.Traceparent(ctx); traceparent != "" {
		req.Header.Set(tracing.HeaderTraceparent, traceparent)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, responseBodyMax))
	return resp.StatusCode, nil
}

// Error classes of the delivery log.
const (
	ClassTimeout           = "timeout"
	ClassConnectionRefused = "connection_refused"
	ClassConnectionReset   = "connection_reset"
	ClassConnectionClosed  = "connection_closed"
	ClassDNS               = "dns"
	ClassTLS               = "tls"
	ClassCanceled          = "canceled"
	ClassTransport         = "transport"
)

// ErrorClass names the kind of a transport error without its text (which
// embeds the URL).
func ErrorClass(err error) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostnameErr x509.HostnameError
	var recordErr tls.RecordHeaderError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return ClassTimeout
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassConnectionRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ClassConnectionReset
	case errors.As(err, &dnsErr):
		return ClassDNS
	case errors.As(err, &certErr), errors.As(err, &unknownAuthority), errors.As(err, &hostnameErr), errors.As(err, &recordErr):
		return ClassTLS
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ClassConnectionClosed
	}
	return ClassTransport
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// withSequence puts the outbox row's id into the body as "sequence".
// Deliveries arrive in any order (retries, several at a time), but one
// user's asset gets its ids in the order its balance changed: the ledger
// writes them under that balance's row lock. A receiver keeps the highest.
func withSequence(payload []byte, id int64) []byte {
	if len(payload) < 2 || payload[0] != '{' {
		return payload
	}
	out := make([]byte, 0, len(payload)+32)
	out = append(out, `{"sequence":`...)
	out = strconv.AppendInt(out, id, 10)
	if payload[1] != '}' {
		out = append(out, ',')
	}
	return append(out, payload[1:]...)
}
