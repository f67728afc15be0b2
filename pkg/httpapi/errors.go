package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// retryAfterUnavailable is what a caller is told to wait when storage is
// down: long enough not to hammer a recovering database, short enough
// that a provider's retry lands soon after it is back.
const retryAfterUnavailable = 5

// Codes are the stable identifiers of error answers: callers branch on
// them, so one is never renamed or reused. openapi.yaml lists them all
// (the Error schema's enum), and a test keeps the two in step.
const (
	CodeInvalidSignature = "invalid_signature"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"
	CodeInvalidAmount    = "invalid_amount"
	CodeUnknownUser      = "unknown_user"
	CodeUnknownAsset     = "unknown_asset"
	CodeInvalidRequest   = "invalid_request"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeConflict         = "conflict"
	CodeBodyTooLarge     = "body_too_large"
	CodeRateLimited      = "rate_limited"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)

// Error kinds of the HTTP edge itself (errBodyTooLarge is readBody's);
// the domain's kinds come from pkg/payment.
var (
	errSignature        = errors.New("missing or invalid signature")
	errUnauthorized     = errors.New("missing or invalid token")
	errForbidden        = errors.New("forbidden")
	errMethodNotAllowed = errors.New("method not allowed")
	errRateLimited      = errors.New("rate limit exceeded")
	errInternal         = errors.New("internal error")
)

// errorKind is one row of the map from error kinds to answers.
type errorKind struct {
	kind    error
	status  int
	code    string
	message string // the answer's text unless the error brings its own
	// generic marks the kind an answer known only by its status gets
	// (echo's own errors, WriteError).
	generic bool
}

// errorKinds is the one map from error kind to status and code. It is
// matched in order with errors.Is, so a narrower kind comes before the
// kind it wraps (an unknown user is also invalid input). An error of no
// kind is internal: "unavailable" is a claim that must be proven.
var errorKinds = []errorKind{
	{kind: errSignature, status: http.StatusUnauthorized, code: CodeInvalidSignature, message: "missing or invalid signature"},
	{kind: errUnauthorized, status: http.StatusUnauthorized, code: CodeUnauthorized, message: "missing or invalid token", generic: true},
	{kind: errForbidden, status: http.StatusForbidden, code: CodeForbidden, message: "forbidden", generic: true},
	{kind: payment.ErrBadAmount, status: http.StatusBadRequest, code: CodeInvalidAmount, message: "invalid amount"},
	{kind: payment.ErrUnknownUser, status: http.StatusBadRequest, code: CodeUnknownUser, message: "unknown user"},
	{kind: payment.ErrUnknownAsset, status: http.StatusBadRequest, code: CodeUnknownAsset, message: "unknown asset"},
	{kind: payment.ErrInvalid, status: http.StatusBadRequest, code: CodeInvalidRequest, message: "invalid request", generic: true},
	{kind: payment.ErrNotFound, status: http.StatusNotFound, code: CodeNotFound, message: "not found", generic: true},
	{kind: errMethodNotAllowed, status: http.StatusMethodNotAllowed, code: CodeMethodNotAllowed, message: "method not allowed", generic: true},
	{kind: payment.ErrConflict, status: http.StatusConflict, code: CodeConflict, message: "conflict", generic: true},
	{kind: errBodyTooLarge, status: http.StatusRequestEntityTooLarge, code: CodeBodyTooLarge, message: "request body too large", generic: true},
	{kind: errRateLimited, status: http.StatusTooManyRequests, code: CodeRateLimited, message: "rate limit exceeded", generic: true},
	{kind: payment.ErrUnavailable, status: http.StatusServiceUnavailable, code: CodeUnavailable, message: "storage unavailable, retry later", generic: true},
	// A transient storage failure and a storage call past its deadline
	// are outages seen by this request: the caller's retry will do.
	{kind: payment.ErrRetryable, status: http.StatusServiceUnavailable, code: CodeUnavailable, message: "storage unavailable, retry later"},
	{kind: context.DeadlineExceeded, status: http.StatusServiceUnavailable, code: CodeUnavailable, message: "storage unavailable, retry later"},
	{kind: context.Canceled, status: http.StatusServiceUnavailable, code: CodeUnavailable, message: "storage unavailable, retry later"},
	{kind: errInternal, status: http.StatusInternalServerError, code: CodeInternal, message: "internal error", generic: true},
}

// internalKind answers every error of no known kind.
var internalKind = errorKinds[len(errorKinds)-1]

// Codes lists every code an error answer can carry.
func Codes() []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range errorKinds {
		if !seen[k.code] {
			seen[k.code] = true
			out = append(out, k.code)
		}
	}
	return out
}

// classify finds err's row in errorKinds.
func classify(err error) errorKind {
	for _, k := range errorKinds {
		if errors.Is(err, k.kind) {
			return k
		}
	}
	return internalKind
}

// kindOfStatus is the generic kind of an answer known only by its
// status; a status of no row is invalid input (4xx) or internal.
func kindOfStatus(status int) errorKind {
	for _, k := range errorKinds {
		if k.generic && k.status == status {
			return k
		}
	}
	if status >= http.StatusBadRequest && status < http.StatusInternalServerError {
		return kindOfStatus(http.StatusBadRequest)
	}
	return internalKind
}

// apiError is an answer that is not a success. Its code comes from kind
// (an error classified by errorKinds) or, without one, from the generic
// kind of status; message is shown to the caller; cause is logged and
// never shown, so internal text cannot leak.
type apiError struct {
	status     int
	kind       error
	message    string
	retryAfter int // seconds; 0: the kind's default
	cause      error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.message + ": " + e.cause.Error()
	}
	return e.message
}

func (e *apiError) Unwrap() error { return e.cause }

// class is the answer's row of errorKinds.
func (e *apiError) class() errorKind {
	if e.kind != nil {
		return classify(e.kind)
	}
	return kindOfStatus(e.status)
}

// fail answers with kind (an error of errorKinds) and a message for the
// caller; an empty message is the kind's own.
func fail(kind error, message string) *apiError {
	k := classify(kind)
	if message == "" {
		message = k.message
	}
	return &apiError{status: k.status, kind: kind, message: message}
}

// newError answers status with its generic kind (not_found for 404,
// invalid_request for 400, …); fail names a narrower kind.
func newError(status int, message string) *apiError {
	if message == "" {
		message = kindOfStatus(status).message
	}
	return &apiError{status: status, message: message}
}

// errorBody is every error's JSON shape.
type errorBody struct {
	Error   string `json:"error"`
	Code    string `json:"code"`
	TraceID string `json:"trace_id"`
}

// unknownUserRead answers a read of a user that does not exist: 404, as
// for any missing resource, with the contract's code for an unknown user.
func unknownUserRead() *apiError {
	return &apiError{status: http.StatusNotFound, kind: payment.ErrUnknownUser, message: "unknown user"}
}

// storeError turns a storage error into its answer by its kind.
func storeError(err error) *apiError {
	k := classify(err)
	return &apiError{status: k.status, kind: err, message: k.message, cause: err}
}

// reasonOf names a refusal for the webhook metric by its code.
func reasonOf(answer *apiError) string {
	if code := answer.class().code; code != CodeInvalidRequest {
		return code
	}
	return "invalid"
}

// handleError is echo's error handler: every error, including the
// router's own 404 and 405, becomes {"error", "code", "trace_id"} JSON.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var answer *apiError
	var httpErr *echo.HTTPError
	switch {
	case errors.As(err, &answer):
	case errors.As(err, &httpErr):
		// Echo's own errors (routing, its middleware): the status's
		// generic answer, never echo's message, which may carry internals.
		answer = newError(httpErr.Code, "")
		answer.cause = err
	default:
		answer = storeError(err)
	}
	status, code := answer.status, answer.class().code
	if status >= http.StatusInternalServerError && status != http.StatusServiceUnavailable {
		logging.From(c.Request().Context()).Error().Err(answer).Int("status", status).Str("code", code).Msg("request failed")
	} else if answer.cause != nil {
		logging.From(c.Request().Context()).Warn().Err(answer).Int("status", status).Str("code", code).Msg("request refused")
	}
	writeError(c.Response(), c.Request(), answer)
}

// writeError writes an error answer directly; it is shared with routes
// other packages contribute, which see only net/http.
func writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	code := e.class().code
	retryAfter := e.retryAfter
	if retryAfter == 0 && code == CodeUnavailable {
		retryAfter = retryAfterUnavailable
	}
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeJSON(w, e.status, errorBody{Error: e.message, Code: code, TraceID: TraceID(r.Context())})
}

// WriteError answers with the API's JSON error shape, the status's
// generic code and the request's trace id, for routes contributed
// through Options.
func WriteError(w http.ResponseWriter, r *http.Request, status int, message string) {
	writeError(w, r, newError(status, message))
}
