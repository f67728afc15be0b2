// Package admin contributes the notification endpoints to the api's admin
// listener: the delivery log and redelivery. Apart from pkg/notify so the
// worker, which delivers, does not link the HTTP server.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Bounds of the admin endpoints.
const (
	adminBodyMax        = 16 << 10
	operatorMax         = payment.OperatorLengthMax
	adminRequestTimeout = 10 * time.Second
)

// Store is what the notification endpoints need.
type Store interface {
	Notifications(ctx context.Context, state string, beforeID int64, limit int) ([]postgres.NotificationView, error)
	RedeliverNotification(ctx context.Context, id int64, who string) (string, error)
	RedeliverFailedNotifications(ctx context.Context, limit int, who string) (int64, bool, error)
}

// Routes are GET /admin/notifications,
// POST /admin/notifications/{id}/redeliver and
// POST /admin/notifications/redeliver (the failed ones, in bulk), for the
// api's admin listener.
func Routes(store Store) []httpapi.Route {
	h := &adminHandlers{store: store}
	return []httpapi.Route{
		{Method: http.MethodGet, Path: "/admin/notifications", Handler: http.HandlerFunc(h.list)},
		{Method: http.MethodPost, Path: "/admin/notifications/:id/redeliver", Handler: http.HandlerFunc(h.redeliver)},
		{Method: http.MethodPost, Path: "/admin/notifications/redeliver", Handler: http.HandlerFunc(h.redeliverFailed)},
	}
}

type adminHandlers struct{ store Store }

func (h *adminHandlers) list(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	state := query.Get("state")
	if state == "" {
		state = "all"
	}
	if !slices.Contains(postgres.NotificationStates, state) {
		httpapi.WriteError(w, r, http.StatusBadRequest, "state must be pending, delivered, failed or all")
		return
	}
	before, ok := optionalPositive(query.Get("before"), 1<<62)
	if !ok {
		httpapi.WriteError(w, r, http.StatusBadRequest, "before must be a notification id")
		return
	}
	limit, ok := optionalPositive(query.Get("limit"), postgres.NotificationPageMax)
	if !ok {
		httpapi.WriteError(w, r, http.StatusBadRequest, "limit must be 1.."+strconv.Itoa(postgres.NotificationPageMax))
		return
	}
	if limit == 0 {
		limit = postgres.NotificationPageDefault
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminRequestTimeout)
	defer cancel()
	views, err := h.store.Notifications(ctx, state, before, int(limit))
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	if views == nil {
		views = []postgres.NotificationView{}
	}
	body := map[string]any{"notifications": views, "state": state, "trace_id": httpapi.TraceID(r.Context())}
	if len(views) == int(limit) {
		body["next_before"] = views[len(views)-1].ID
	}
	writeJSON(w, http.StatusOK, body)
}

func (h *adminHandlers) redeliver(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(httpapi.PathParam(r, "id"), 10, 64)
	if err != nil || id <= 0 {
		httpapi.WriteError(w, r, http.StatusBadRequest, "id must be a positive integer")
		return
	}
	var req struct {
		Operator string `json:"operator"`
	}
	if !readBody(w, r, &req, `body must be empty or {"operator": string of at most `+strconv.Itoa(operatorMax)+` characters, no control characters}`, func() bool { return payment.NameFits(req.Operator, operatorMax) }) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminRequestTimeout)
	defer cancel()
	result, err := h.store.RedeliverNotification(ctx, id, requester(r, req.Operator))
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "result": result, "trace_id": httpapi.TraceID(r.Context())})
}

// redeliverFailed sends up to limit failed notifications again (a receiver
// was down past their attempts); "more" says whether to ask again.
func (h *adminHandlers) redeliverFailed(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Operator string `json:"operator"`
		Limit    *int   `json:"limit"`
	}
	usage := fmt.Sprintf(`body must be empty or {"operator": string of at most 200 characters, no control characters, "limit": 1..%d}`, postgres.RedeliverFailedMax)
	valid := func() bool {
		return payment.NameFits(req.Operator, operatorMax) && (req.Limit == nil || (*req.Limit >= 1 && *req.Limit <= postgres.RedeliverFailedMax))
	}
	if !readBody(w, r, &req, usage, valid) {
		return
	}
	limit := postgres.RedeliverFailedMax
	if req.Limit != nil {
		limit = *req.Limit
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminRequestTimeout)
	defer cancel()
	scheduled, more, err := h.store.RedeliverFailedNotifications(ctx, limit, requester(r, req.Operator))
	if err != nil {
		writeStoreError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"scheduled": scheduled, "more": more, "trace_id": httpapi.TraceID(r.Context())})
}

// readBody decodes an optional JSON body into req, strictly and within
// adminBodyMax; it answers the error itself and reports false when the
// body is unreadable, too large or not valid (valid runs once decoded).
func readBody(w http.ResponseWriter, r *http.Request, req any, usage string, valid func() bool) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, adminBodyMax+1))
	switch {
	case err != nil:
		httpapi.WriteError(w, r, http.StatusBadRequest, "unreadable body")
		return false
	case len(body) > adminBodyMax:
		httpapi.WriteError(w, r, http.StatusRequestEntityTooLarge, "body too large")
		return false
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := httpapi.DecodeStrict(body, req); err != nil || !valid() {
			httpapi.WriteError(w, r, http.StatusBadRequest, usage)
			return false
		}
	}
	return true
}

// requester is who asked: the operator named, and where the request came
// from, since the admin token names nobody.
func requester(r *http.Request, operator string) string {
	who := strings.TrimSpace(operator)
	if who == "" {
		who = "admin-api"
	}
	return who + " @" + httpapi.ClientIP(r.Context()).String()
}

func optionalPositive(s string, maximum int64) (int64, bool) {
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0 && n <= maximum
}

func writeStoreError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, payment.ErrNotFound):
		httpapi.WriteError(w, r, http.StatusNotFound, "no such notification")
	case errors.Is(err, payment.ErrInvalid):
		httpapi.WriteError(w, r, http.StatusBadRequest, "invalid request")
	case errors.Is(err, payment.ErrUnavailable), errors.Is(err, payment.ErrRetryable), errors.Is(err, context.DeadlineExceeded):
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
