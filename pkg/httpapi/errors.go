package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// retryAfterUnavailable is what a caller is told to wait when storage is
// down: long enough not to hammer a recovering database, short enough
// that a provider's retry lands soon after it is back.
const retryAfterUnavailable = 5

// apiError is an answer that is not a success. message is shown to the
// caller; cause is logged and never shown, so internal text cannot leak.
type apiError struct {
	status     int
	message    string
	retryAfter int // seconds; 0: no Retry-After header
	cause      error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.message + ": " + e.cause.Error()
	}
	return e.message
}

func (e *apiError) Unwrap() error { return e.cause }

func newError(status int, message string) *apiError {
	return &apiError{status: status, message: message}
}

// errorBody is every error's JSON shape.
type errorBody struct {
	Error   string `json:"error"`
	TraceID string `json:"trace_id"`
}

// storeError maps a storage error to an answer: the one place where the
// domain's error kinds become HTTP statuses.
func storeError(err error) *apiError {
	switch {
	case errors.Is(err, payment.ErrUnavailable), errors.Is(err, payment.ErrRetryable),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return &apiError{status: http.StatusServiceUnavailable, message: "storage unavailable, retry later",
			retryAfter: retryAfterUnavailable, cause: err}
	case errors.Is(err, payment.ErrConflict):
		return &apiError{status: http.StatusConflict, message: "conflict", cause: err}
	case errors.Is(err, payment.ErrUnknownUser):
		return &apiError{status: http.StatusBadRequest, message: "unknown user", cause: err}
	case errors.Is(err, payment.ErrUnknownAsset):
		return &apiError{status: http.StatusBadRequest, message: "unknown asset", cause: err}
	case errors.Is(err, payment.ErrNotFound):
		return &apiError{status: http.StatusNotFound, message: "not found", cause: err}
	case errors.Is(err, payment.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, message: "invalid request", cause: err}
	}
	return &apiError{status: http.StatusInternalServerError, message: "internal error", cause: err}
}

// handleError is echo's error handler: every error, including the
// router's own 404 and 405, becomes {"error", "trace_id"} JSON.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var answer *apiError
	var httpErr *echo.HTTPError
	switch {
	case errors.As(err, &answer):
	case errors.As(err, &httpErr):
		// Echo's own errors (routing, its middleware): a fixed text per
		// status, never echo's message, which may carry internals.
		answer = &apiError{status: httpErr.Code, message: strings.ToLower(http.StatusText(httpErr.Code)), cause: err}
		if answer.message == "" {
			answer.message = "error"
		}
	default:
		answer = &apiError{status: http.StatusInternalServerError, message: "internal error", cause: err}
	}
	if answer.status >= http.StatusInternalServerError && answer.status != http.StatusServiceUnavailable {
		logging.From(c.Request().Context()).Error().Err(answer).Int("status", answer.status).Msg("request failed")
	} else if answer.cause != nil {
		logging.From(c.Request().Context()).Warn().Err(answer).Int("status", answer.status).Msg("request refused")
	}
	writeError(c.Response(), c.Request(), answer)
}

// writeError writes an error answer directly; it is shared with routes
// other packages contribute, which see only net/http.
func writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	writeJSON(w, e.status, errorBody{Error: e.message, TraceID: TraceID(r.Context())})
}

// WriteError answers with the API's JSON error shape and the request's
// trace id, for routes contributed through Options.
func WriteError(w http.ResponseWriter, r *http.Request, status int, message string) {
	writeError(w, r, newError(status, message))
}
