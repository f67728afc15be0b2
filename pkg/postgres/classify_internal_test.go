package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestClassify: an outage is what the error proves, nothing more; an
// error nobody expected is internal (it spends retries and reaches the
// DLQ) instead of being retried forever as "unavailable".
func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for name, c := range map[string]struct {
		err         error
		unavailable bool
		retryable   bool
		contention  bool // what the worker retries free for a while
	}{
		"refused":          {err: refused, unavailable: true},
		"reset":            {err: fmt.Errorf("read: %w", syscall.ECONNRESET), unavailable: true},
		"eof":              {err: fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), unavailable: true},
		"conn closed":      {err: pgconn.ErrConnClosed, unavailable: true},
		"deadline":         {err: context.DeadlineExceeded, unavailable: true},
		"admin shutdown":   {err: &pgconn.PgError{Code: codeAdminShutdown}, unavailable: true},
		"lock timeout":     {err: &pgconn.PgError{Code: codeLockNotAvailable}, retryable: true, contention: true},
		"stmt timeout":     {err: &pgconn.PgError{Code: codeQueryCanceled}, retryable: true, contention: true},
		"deadlock":         {err: &pgconn.PgError{Code: codeDeadlockDetected}, retryable: true, contention: true},
		"serialization":    {err: &pgconn.PgError{Code: codeSerializationFail}, retryable: true, contention: true},
		"check violation":  {err: &pgconn.PgError{Code: "23514"}},
		"scan":             {err: errors.New("can't scan into dest[6]: cannot scan NULL into *string")},
		"canceled":         {err: context.Canceled},
		"already unavail.": {err: payment.Unavailable("x", errors.New("breaker open")), unavailable: true},
		// A schema behind the binary: every event's statement fails alike.
		"undefined table":    {err: &pgconn.PgError{Code: "42P01"}, unavailable: true},
		"undefined column":   {err: &pgconn.PgError{Code: "42703"}, unavailable: true},
		"undefined function": {err: &pgconn.PgError{Code: "42883"}, unavailable: true},
	} {
		got := classify("op", c.err)
		require.Equal(t, c.unavailable, errors.Is(got, payment.ErrUnavailable), name)
		require.Equal(t, c.retryable, errors.Is(got, payment.ErrRetryable), name)
		require.ErrorIs(t, got, c.err, name)
		var pgErr *pgconn.PgError
		undefined := errors.As(c.err, &pgErr) && pgErr.Code[:2] == "42"
		require.Equal(t, undefined, SchemaMismatch(got), name)
		require.Equal(t, c.contention, Contention(got), name)
	}
}
