package payment

import (
	"errors"
	"fmt"
)

// Error kinds. Errors are classified with errors.Is against these, never by
// matching their text.
var (
	// ErrRetryable: a transient condition (lock or statement timeout,
	// deadlock, lost connection, concurrent transition); try again later.
	ErrRetryable = errors.New("retryable")
	// ErrAlreadyProcessed: the event reached a terminal status before; the
	// task is done and must not be retried.
	ErrAlreadyProcessed = errors.New("already processed")
	// ErrInvalid: the input can never succeed (unknown user, asset, type,
	// amount beyond the asset's precision).
	ErrInvalid = errors.New("invalid")
	// ErrNotFound: the named thing does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the same identity with different content.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: a dependency (PostgreSQL, Redis, the chain) cannot be
	// reached now.
	ErrUnavailable = errors.New("unavailable")
)

// Retryable wraps err as a transient failure of op.
func Retryable(op string, err error) error {
	return &kindError{kind: ErrRetryable, op: op, err: err}
}

// Invalid reports input that can never succeed.
func Invalid(format string, args ...any) error {
	return &kindError{kind: ErrInvalid, err: fmt.Errorf(format, args...)}
}

// Unavailable wraps err as a dependency outage seen by op.
func Unavailable(op string, err error) error {
	return &kindError{kind: ErrUnavailable, op: op, err: err}
}

// kindError carries a kind and the underlying error; errors.Is matches
// both, so no chain is lost.
type kindError struct {
	kind error
	op   string
	err  error
}

func (e *kindError) Error() string {
	if e.op == "" {
		return fmt.Sprintf("%v: %v", e.kind, e.err)
	}
	return fmt.Sprintf("%s: %v: %v", e.op, e.kind, e.err)
}

func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// TransitionError reports a status move that did not happen because the
// event is elsewhere.
type TransitionError struct {
	EventID string
	From    Status
	To      Status
	Actual  Status
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("event %s: transition %s → %s refused: status is %s", e.EventID, e.From, e.To, e.Actual)
}

// Is classifies the refusal with the seed's semantics: a terminal event is
// already processed; anything else is a concurrent move worth retrying.
func (e *TransitionError) Is(target error) bool {
	switch target {
	case ErrAlreadyProcessed:
		return e.Actual.Terminal()
	case ErrRetryable:
		return !e.Actual.Terminal()
	}
	return false
}
