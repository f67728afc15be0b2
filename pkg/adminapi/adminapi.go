// Package adminapi contributes the operator endpoints to the API: DLQ
// administration instead of hand-written SQL, and the asynqmon queue
// dashboard. It plugs into httpapi through its Route and Mount hooks.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Bounds.
const (
	bodyMax        = 16 << 10
	reasonMax      = payment.ReasonLengthMax
	operatorMax    = payment.OperatorLengthMax
	dashboardRoot  = "/admin/queues"
	requestTimeout = 10 * time.Second
)

// DeadLetters is the DLQ store.
type DeadLetters interface {
	DeadLetters(ctx context.Context, state string, afterID int64, limit int) ([]postgres.DeadLetterView, error)
	DeadLetter(ctx context.Context, id int64) (postgres.DeadLetterView, error)
	ReplayDeadLetter(ctx context.Context, id int64, who, why string) (postgres.ReplayResult, error)
	DiscardDeadLetter(ctx context.Context, id int64, who, why string) (bool, error)
}

// Routes are the DLQ endpoints.
func Routes(store DeadLetters) []httpapi.Route {
	h := &handlers{store: store}
	return []httpapi.Route{
		{Method: http.MethodGet, Path: "/admin/dlq", Handler: http.HandlerFunc(h.list)},
		{Method: http.MethodGet, Path: "/admin/dlq/:id", Handler: http.HandlerFunc(h.show)},
		{Method: http.MethodPost, Path: "/admin/dlq/:id/replay", Handler: http.HandlerFunc(h.replay)},
		{Method: http.MethodPost, Path: "/admin/dlq/:id/discard", Handler: http.HandlerFunc(h.discard)},
	}
}

type handlers struct{ store DeadLetters }

// entry is a DLQ row on the wire; amounts are strings.
type entry struct {
	ID          int64           `json:"id"`
	EventID     string          `json:"event_id"`
	EventType   string          `json:"event_type"`
	UserID      int64           `json:"user_id,omitempty"`
	Asset       string          `json:"asset,omitempty"`
	Amount      string          `json:"amount,omitempty"`
	Error       string          `json:"error"`
	Attempt     int             `json:"attempt"`
	Generation  int             `json:"generation"`
	Source      string          `json:"source"`
	TraceID     string          `json:"trace_id,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	EventStatus string          `json:"event_status,omitempty"`
	Resolution  string          `json:"resolution,omitempty"`
	ResolvedBy  string          `json:"resolved_by,omitempty"`
	ResolvedAt  *time.Time      `json:"resolved_at,omitempty"`
	Reason      string          `json:"resolution_reason,omitempty"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

func toEntry(v postgres.DeadLetterView) entry {
	l := v.Letter
	return entry{
		ID: v.ID, EventID: l.EventID, EventType: l.EventType, UserID: l.UserID, Asset: l.Asset, Amount: l.Amount,
		Error: l.Error, Attempt: l.Attempt, Generation: l.Generation, Source: string(l.Source), TraceID: l.TraceID,
		CreatedAt: l.CreatedAt, EventStatus: v.EventStatus, Resolution: v.Resolution, ResolvedBy: v.ResolvedBy,
		ResolvedAt: v.ResolvedAt, Reason: v.Reason, Payload: l.Payload,
	}
}

func (h *handlers) list(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	state := query.Get("state")
	if state == "" {
		state = "open"
	}
	if state != "open" && state != "resolved" && state != "all" {
		httpapi.WriteError(w, r, http.StatusBadRequest, "state must be open, resolved or all")
		return
	}
	after, err := optionalInt(query.Get("after"))
	if err != nil {
		httpapi.WriteError(w, r, http.StatusBadRequest, "after must be a non-negative integer")
		return
	}
	limit, err := optionalInt(query.Get("limit"))
	if err != nil || limit > postgres.DeadLetterPageMax {
		httpapi.WriteError(w, r, http.StatusBadRequest, "limit must be 1.."+strconv.Itoa(postgres.DeadLetterPageMax))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	views, err := h.store.DeadLetters(ctx, state, after, int(limit))
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	out := make([]entry, 0, len(views))
	for _, v := range views {
		out = append(out, toEntry(v))
	}
	body := map[string]any{"entries": out, "state": state}
	if len(out) > 0 {
		body["next_after"] = out[len(out)-1].ID
	}
	writeJSON(w, http.StatusOK, body)
}

func (h *handlers) show(w http.ResponseWriter, r *http.Request) {
	id, ok := entryID(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	v, err := h.store.DeadLetter(ctx, id)
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toEntry(v))
}

// decision is the body of replay and discard.
type decision struct {
	Reason   string `json:"reason"`
	Operator string `json:"operator"`
}

func (h *handlers) replay(w http.ResponseWriter, r *http.Request) {
	id, ok := entryID(w, r)
	if !ok {
		return
	}
	d, ok := readDecision(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	result, err := h.store.ReplayDeadLetter(ctx, id, operator(r, d), d.Reason)
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "result": result, "trace_id": httpapi.TraceID(r.Context())})
}

func (h *handlers) discard(w http.ResponseWriter, r *http.Request) {
	id, ok := entryID(w, r)
	if !ok {
		return
	}
	d, ok := readDecision(w, r)
	if !ok {
		return
	}
	if strings.TrimSpace(d.Reason) == "" {
		httpapi.WriteError(w, r, http.StatusBadRequest, "a discard needs a reason")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	changed, err := h.store.DiscardDeadLetter(ctx, id, operator(r, d), d.Reason)
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	result := "discarded"
	if !changed {
		result = "already_discarded"
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "result": result, "trace_id": httpapi.TraceID(r.Context())})
}

// operator is who decided: the name the caller gives, qualified with where
// the request came from (the admin token itself names nobody).
func operator(r *http.Request, d decision) string {
	who := strings.TrimSpace(d.Operator)
	if who == "" {
		who = "admin-api"
	}
	return who + " @" + httpapi.ClientIP(r.Context()).String()
}

func readDecision(w http.ResponseWriter, r *http.Request) (decision, bool) {
	var d decision
	body, err := io.ReadAll(io.LimitReader(r.Body, bodyMax+1))
	if err != nil {
		httpapi.WriteError(w, r, http.StatusBadRequest, "unreadable body")
		return d, false
	}
	if len(body) > bodyMax {
		httpapi.WriteError(w, r, http.StatusRequestEntityTooLarge, "body too large")
		return d, false
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := httpapi.DecodeStrict(body, &d); err != nil {
			httpapi.WriteError(w, r, http.StatusBadRequest, "body must be {\"reason\": string, \"operator\": string}")
			return d, false
		}
	}
	if !payment.NoteFits(d.Reason, reasonMax) || !payment.NameFits(d.Operator, operatorMax) {
		httpapi.WriteError(w, r, http.StatusBadRequest, fmt.Sprintf("reason (at most %d characters, no control characters but line breaks and tabs) or operator (at most %d characters, no control characters) does not fit", reasonMax, operatorMax))
		return d, false
	}
	return d, true
}

func entryID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(httpapi.PathParam(r, "id"), 10, 64)
	if err != nil || id <= 0 {
		httpapi.WriteError(w, r, http.StatusBadRequest, "id must be a positive integer")
		return 0, false
	}
	return id, true
}

func optionalInt(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("not a non-negative integer")
	}
	return n, nil
}

// writeStoreError maps the store's error kinds to statuses; internal text
// never reaches the caller.
func writeStoreError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, payment.ErrNotFound):
		httpapi.WriteError(w, r, http.StatusNotFound, "no such dead-letter entry")
	case errors.Is(err, postgres.ErrDiscarded):
		httpapi.WriteError(w, r, http.StatusConflict, "the entry was discarded and cannot be replayed")
	case errors.Is(err, postgres.ErrReplayed):
		httpapi.WriteError(w, r, http.StatusConflict, "the entry was replayed and cannot be discarded")
	case errors.Is(err, postgres.ErrFailureReplayed):
		httpapi.WriteError(w, r, http.StatusConflict, "the failure this entry records was replayed since through another entry, so the event runs again; replay this entry to close it")
	case errors.Is(err, postgres.ErrNoEvent):
		httpapi.WriteError(w, r, http.StatusConflict, "the entry names no stored event; discard it instead")
	case errors.Is(err, payment.ErrInvalid):
		httpapi.WriteError(w, r, http.StatusBadRequest, "invalid request")
	case errors.Is(err, payment.ErrUnavailable), errors.Is(err, payment.ErrRetryable):
		w.Header().Set("Retry-After", "5")
		httpapi.WriteError(w, r, http.StatusServiceUnavailable, "database unavailable, try again")
	default:
		httpapi.WriteError(w, r, http.StatusInternalServerError, "internal error")
	}
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// sharedRedis hands asynqmon the API's own Redis client, so the dashboard
// follows every topology REDIS_URL supports (Sentinel included).
type sharedRedis struct{ client redis.UniversalClient }

func (s sharedRedis) MakeRedisClient() any { return s.client }

// Dashboard is the asynqmon UI and its JSON API, mounted at /admin/queues/.
// readOnly hides the buttons that delete or archive tasks: the database is
// the source of truth and stale recovery would bring such events back, so
// operators act through the DLQ endpoints instead.
func Dashboard(client redis.UniversalClient, readOnly bool) httpapi.Mount {
	return DashboardWith(client, DashboardOptions{ReadOnly: readOnly})
}

// DashboardOptions configure the asynqmon dashboard.
type DashboardOptions struct {
	ReadOnly bool
	// PrometheusURL (ASYNQMON_PROMETHEUS_URL), when set, is the Prometheus
	// that scrapes the scheduler's asynq_* series: asynqmon's Metrics tab
	// queries it from the api (the browser never talks to it).
	PrometheusURL string
}

// DashboardWith is Dashboard with every option.
func DashboardWith(client redis.UniversalClient, o DashboardOptions) httpapi.Mount {
	handler := asynqmon.New(asynqmon.Options{
		RootPath:          dashboardRoot,
		RedisConnOpt:      sharedRedis{client: client},
		ReadOnly:          o.ReadOnly,
		PrometheusAddress: o.PrometheusURL,
	})
	return httpapi.Mount{Prefix: dashboardRoot + "/", Handler: dashboardHeaders(dashboardPolicy(handler), refuseCrossSite(jsonErrors(handler, logging.NewRedactor(o.PrometheusURL))))}
}

// refuseCrossSite answers 403 to a dashboard action another site's page
// made the operator's browser send: the mount takes HTTP Basic, which a
// browser resends by itself, and asynqmon checks no origin or token.
// Reads pass, so a link to the dashboard still opens it.
func refuseCrossSite(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !httpapi.SameOrigin(r) {
			logging.From(r.Context()).Warn().Str("method", r.Method).Str("path", r.URL.Path).
				Str("origin", r.Header.Get("Origin")).Str("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")).
				Msg("queue dashboard: cross-site action refused")
			httpapi.WriteError(w, r, http.StatusForbidden, "cross-site request refused")
			return
		}
		next.ServeHTTP(w, r)
	})
}

var _ asynq.RedisConnOpt = sharedRedis{}
