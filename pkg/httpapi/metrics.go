package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// routeUnmatched labels requests that matched no route.
const routeUnmatched = "unmatched"

// The webhook routes, whose 5xx SettleWebhook5xxRatio watches.
const (
	routeWebhookPayments  = "/webhook/payments"
	routeWebhookAlchemy   = "/webhook/alchemy"
	routeWebhookQuickNode = "/webhook/quicknode"
	routeWebhookMoralis   = "/webhook/moralis"
)

// Webhook sources and outcomes, as metric labels.
const (
	sourcePayments  = "payments"
	sourceAlchemy   = "alchemy"
	sourceQuickNode = "quicknode"
	sourceMoralis   = "moralis"

	outcomeAccepted  = "accepted"
	outcomeDuplicate = "duplicate"
	outcomeConflict  = "conflict"
	outcomeRejected  = "rejected"
	outcomeIgnored   = "ignored"
	outcomeReversed  = "reversed"
)

type metrics struct {
	requests          *prometheus.CounterVec
	latency           *prometheus.HistogramVec
	webhooks          *prometheus.CounterVec
	deliveries        *prometheus.CounterVec
	rateLimited       *prometheus.CounterVec
	rateLimitFallback prometheus.Counter
	authFailures      prometheus.Counter
	panics            prometheus.Counter
}

// newMetrics registers the API's metrics on reg. The Go and process
// collectors are added when reg is new (the binary passes nil).
func newMetrics(reg *prometheus.Registry, addRuntime bool) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_api_http_requests_total",
			Help: "HTTP requests by method, route template and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "settle_api_http_request_duration_seconds",
			Help:    "HTTP request latency by method, route template and status.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"method", "route", "status"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_api_webhook_outcomes_total",
			Help: "Webhook deliveries (payments) and transfers (alchemy, quicknode, moralis) by outcome: accepted, duplicate, conflict, rejected, ignored, reversed; reason says why one was rejected or ignored.",
		}, []string{"source", "outcome", "reason"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_provider_deliveries_total",
			Help: "Deliveries to a provider route (alchemy, quicknode, moralis) by result: accepted for a 200, else the answer's error code (invalid_signature, body_too_large, ...). Their transfers are counted in settle_api_webhook_outcomes_total{source=<provider>}.",
		}, []string{"provider", "result"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_api_rate_limited_total",
			Help: "Requests refused with 429 by the per-client rate limit.",
		}, []string{"route"}),
		rateLimitFallback: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_api_rate_limit_fallback_total",
			Help: "Rate-limit decisions made in process because Redis was unreachable.",
		}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_api_auth_failures_total",
			Help: "Requests refused for a missing or wrong bearer token.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_api_panics_total",
			Help: "Handler panics recovered into a 500.",
		}),
	}
	reg.MustRegister(m.requests, m.latency, m.webhooks, m.deliveries, m.rateLimited, m.rateLimitFallback, m.authFailures, m.panics)
	// The webhooks' 5xx series exist at 0 from the start (the api answers
	// no other 5xx), so SettleWebhook5xxRatio's rate() counts the first.
	for _, route := range []string{routeWebhookPayments, routeWebhookAlchemy, routeWebhookQuickNode, routeWebhookMoralis} {
		for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable} {
			m.requests.WithLabelValues(http.MethodPost, route, strconv.Itoa(status))
		}
	}
	if addRuntime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// standardMethods are labelled as themselves; anything a client invents
// is "other", so the label set stays bounded.
var standardMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

func (m *metrics) observeRequest(method, route string, status int, elapsed time.Duration) {
	if !standardMethods[method] {
		method = "other"
	}
	code := strconv.Itoa(status)
	m.requests.WithLabelValues(method, route, code).Inc()
	m.latency.WithLabelValues(method, route, code).Observe(elapsed.Seconds())
}

func (m *metrics) delivery(provider, result string) {
	m.deliveries.WithLabelValues(provider, result).Inc()
}

func (m *metrics) webhook(source, outcome, reason string) {
	m.webhooks.WithLabelValues(source, outcome, reason).Inc()
}
