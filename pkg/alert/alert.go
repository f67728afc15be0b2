// Package alert is settle's one way to tell a human. Every alert is logged;
// when a webhook is configured it is also POSTed as JSON. Alerts are
// rate-limited per key with a bounded key table, and raising one never
// blocks or panics the caller: delivery happens on a bounded queue in the
// background, and what cannot be queued is counted and dropped (it was
// logged already).
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/logging"
)

// Severity orders alerts.
type Severity string

const (
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// Defaults of the seed: a key alerts at most once per cooldown, and the
// key table is bounded.
const (
	CooldownDefault      = 5 * time.Minute
	KeysMaxDefault       = 1000
	QueueMaxDefault      = 256
	DeliveryTimeout      = 5 * time.Second
	DeliveryAttemptsMax  = 3
	deliveryBackoffFirst = 500 * time.Millisecond
)

// Alert is one message for a human.
type Alert struct {
	Key      string         `json:"key"`
	Severity Severity       `json:"severity"`
	Summary  string         `json:"summary"`
	Fields   map[string]any `json:"fields,omitempty"`
	Service  string         `json:"service"`
	At       time.Time      `json:"at"`
	// Suppressed counts alerts of this key dropped since the last one sent.
	Suppressed int `json:"suppressed,omitempty"`
}

// Options configure an Alerter.
type Options struct {
	Service    string
	WebhookURL string // empty: log only
	Cooldown   time.Duration
	KeysMax    int
	QueueMax   int
	Client     *http.Client
	Registerer prometheus.Registerer
	// Shared, when set, holds each key's cooldown in Redis as well, for
	// replicas that raise the same alerts (the scheduler's checks run on
	// whichever replica wins a period): the first one's alert is posted,
	// the others' within the cooldown are not. Unreachable, each replica
	// posts its own.
	Shared redis.UniversalClient
}

// sharedTimeout bounds the shared cooldown's one Redis call.
const sharedTimeout = time.Second

// Alerter rate-limits, logs and delivers alerts.
type Alerter struct {
	log     zerolog.Logger
	opts    Options
	now     func() time.Time
	mu      sync.Mutex
	keys    map[string]*keyState
	queue   chan Alert
	stopped chan struct{}
	// base is cancelled by Close, ending a delivery in flight.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sent        *prometheus.CounterVec
	suppressed  *prometheus.CounterVec
	dropped     prometheus.Counter
	deliveryErr prometheus.Counter
}

type keyState struct {
	lastSent   time.Time
	suppressed int
}

// New starts an Alerter; Close stops its delivery goroutine.
func New(log zerolog.Logger, opts Options) *Alerter {
	if opts.Cooldown <= 0 {
		opts.Cooldown = CooldownDefault
	}
	if opts.KeysMax <= 0 {
		opts.KeysMax = KeysMaxDefault
	}
	if opts.QueueMax <= 0 {
		opts.QueueMax = QueueMaxDefault
	}
	if opts.Client == nil {
		opts.Client = &http.Client{
			Timeout: DeliveryTimeout,
			// A redirect is a failed delivery: following a 307 re-posts the
			// alert (and the configured URL, as Referer) to a host nobody
			// configured, and a 301/302/303 turns it into a GET without it.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	base, cancel := context.WithCancel(context.Background())
	a := &Alerter{
		log: log, opts: opts, now: time.Now, base: base, cancel: cancel,
		keys:    map[string]*keyState{},
		queue:   make(chan Alert, opts.QueueMax),
		stopped: make(chan struct{}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_alerts_total", Help: "Alerts raised and passed the per-key rate limit, by severity.",
		}, []string{"severity"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_alerts_suppressed_total", Help: "Alerts suppressed by the per-key cooldown (replica: another scheduler replica's, shared in Redis) or the full key table.",
		}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_alerts_dropped_total", Help: "Alerts not delivered to the webhook because its queue was full (they were logged).",
		}),
		deliveryErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_alert_delivery_failures_total", Help: "Alert webhook deliveries that failed after every attempt.",
		}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(a.sent, a.suppressed, a.dropped, a.deliveryErr)
	}
	a.wg.Add(1)
	go a.deliver()
	return a
}

// Raise records an alert. It returns at once and never panics.
func (a *Alerter) Raise(key string, severity Severity, summary string, fields map[string]any) {
	defer func() {
		if r := recover(); r != nil {
			a.log.Error().Interface("panic", r).Str("alert_key", key).Msg("alert raising panicked")
		}
	}()
	now := a.now()
	suppressedBefore, ok, reason := a.admit(key, now)
	event := a.log.WithLevel(levelOf(severity)).Str("alert_key", key).Str("severity", string(severity)).Fields(fields)
	if !ok {
		a.suppressed.WithLabelValues(reason).Inc()
		event.Bool("suppressed", true).Msg(summary)
		return
	}
	a.sent.WithLabelValues(string(severity)).Inc()
	event.Bool("alert", true).Int("suppressed_since_last", suppressedBefore).Msg(summary)
	if a.opts.WebhookURL == "" {
		return
	}
	msg := Alert{Key: key, Severity: severity, Summary: summary, Fields: fields, Service: a.opts.Service, At: now, Suppressed: suppressedBefore}
	select {
	case a.queue <- msg:
	default:
		a.dropped.Inc()
	}
}

// admit applies the per-key cooldown and the bound on tracked keys: when
// the table is full, stale keys (past their cooldown) are evicted first;
// if none are stale, the new key is suppressed rather than the table grown.
func (a *Alerter) admit(key string, now time.Time) (suppressedBefore int, ok bool, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st, found := a.keys[key]; found {
		if now.Sub(st.lastSent) < a.opts.Cooldown {
			st.suppressed++
			return 0, false, "cooldown"
		}
		suppressedBefore, st.suppressed, st.lastSent = st.suppressed, 0, now
		return suppressedBefore, true, ""
	}
	if len(a.keys) >= a.opts.KeysMax {
		for k, st := range a.keys {
			if now.Sub(st.lastSent) >= a.opts.Cooldown {
				delete(a.keys, k)
			}
		}
		if len(a.keys) >= a.opts.KeysMax {
			return 0, false, "key_table_full"
		}
	}
	a.keys[key] = &keyState{lastSent: now}
	return 0, true, ""
}

// TrackedKeys is the size of the key table (tests, metrics).
func (a *Alerter) TrackedKeys() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.keys)
}

func (a *Alerter) deliver() {
	defer a.wg.Done()
	for {
		select {
		case <-a.stopped:
			return
		case msg := <-a.queue:
			if a.sharedCooldown(msg) {
				a.post(msg)
			}
		}
	}
}

// sharedCooldown takes msg's key for the cooldown in Redis; false when
// another replica took it within the cooldown (the alert was logged here,
// and is counted suppressed). Asked on the delivery goroutine, so Raise
// never waits for Redis.
func (a *Alerter) sharedCooldown(msg Alert) bool {
	if a.opts.Shared == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(a.base, sharedTimeout)
	defer cancel()
	took, err := a.opts.Shared.SetNX(ctx, "settle:alert:"+a.opts.Service+":"+msg.Key, 1, a.opts.Cooldown).Result()
	if err != nil || took {
		return true
	}
	a.suppressed.WithLabelValues("replica").Inc()
	return false
}

// post sends one alert with bounded attempts and a timeout each.
func (a *Alerter) post(msg Alert) {
	body, err := json.Marshal(msg)
	if err != nil {
		a.log.Error().Err(err).Str("alert_key", msg.Key).Msg("alert not encodable")
		return
	}
	backoff := deliveryBackoffFirst
	var last error
	for attempt := 1; attempt <= DeliveryAttemptsMax; attempt++ {
		if last = a.postOnce(body); last == nil {
			return
		}
		select {
		case <-a.stopped:
			return
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	a.deliveryErr.Inc()
	// The client's errors embed the webhook URL, itself a secret.
	a.log.Error().Err(logging.RedactError(last)).Str("receiver", logging.URL(a.opts.WebhookURL)).
		Str("alert_key", msg.Key).Msg("alert webhook delivery failed")
}

func (a *Alerter) postOnce(body []byte) error {
	ctx, cancel := context.WithTimeout(a.base, DeliveryTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.opts.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.opts.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered HTTP %d", resp.StatusCode)
	}
	return nil
}

// Close stops delivery; queued alerts not yet sent are dropped (logged).
func (a *Alerter) Close() {
	close(a.stopped)
	a.cancel()
	a.wg.Wait()
}

func levelOf(s Severity) zerolog.Level {
	if s == Critical {
		return zerolog.ErrorLevel
	}
	return zerolog.WarnLevel
}
