package postgres

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectCause says why a connect failed without the driver's text, which
// names the host, port, user and database of DATABASE_URL.
func ConnectCause(err error) string {
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pgErr): // the server's answer: wrong password, no such database
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	case errors.As(err, &dnsErr):
		return "host not found"
	case errors.As(err, &opErr) && opErr.Err != nil:
		return opErr.Err.Error() // "connect: connection refused", "i/o timeout"
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer"
	}
	// The innermost error (a TLS or protocol failure), below the driver's
	// wrapping that names the connection.
	for {
		switch e := err.(type) { //nolint:errorlint // unwraps the chain by hand, one link at a time
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }: // Open's "connect: %w (last try: %w)"
			if errs := e.Unwrap(); len(errs) > 0 {
				err = errs[len(errs)-1]
			} else {
				err = nil
			}
		default:
			return err.Error()
		}
		if err == nil {
			return "connection failed"
		}
	}
}
