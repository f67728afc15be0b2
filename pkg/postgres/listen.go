package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxChannel is the channel insert_event notifies.
const OutboxChannel = "settle_outbox"

// Reconnect backoff of the listener.
const (
	listenBackoffFirst = 100 * time.Millisecond
	listenBackoffMax   = 10 * time.Second
)

// Listen holds one dedicated connection LISTENing on channel and calls
// wake for every notification until ctx ends; a lost connection is
// re-established with bounded backoff (the caller's poll covers the gap).
// LISTEN is session state: behind PgBouncer in transaction pooling, point
// dsn at PostgreSQL directly.
func Listen(ctx context.Context, dsn, channel string, wake func(), onError func(error)) {
	backoff := listenBackoffFirst
	for ctx.Err() == nil {
		err := listenOnce(ctx, dsn, channel, wake, func() { backoff = listenBackoffFirst }, onError)
		if ctx.Err() != nil {
			return
		}
		onError(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, listenBackoffMax)
	}
}

// selfCheckTimeout bounds waiting for our own notification.
const selfCheckTimeout = 2 * time.Second

// errListenPooled is what the self-check reports when LISTEN cannot be
// trusted: the enqueuer then runs on its poll alone.
const errListenPooled = "LISTEN receives no notifications reliably (%s: is this connection behind a transaction pooler? point DATABASE_LISTEN_URL at PostgreSQL directly); the outbox is polled only"

// selfCheck makes sure the listening session is a real PostgreSQL session
// that hears its channel. Behind a transaction pooler LISTEN lands on a
// pooled server connection and notifications reach whoever holds it, so
// the enqueuer would silently run on its poll alone: say so. A pooler
// shows itself by the backend pid: the one given at startup is its own,
// not the server's. The round trip of a notification catches the rest.
func selfCheck(ctx context.Context, conn *pgx.Conn, channel string) error {
	var serverPID uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&serverPID); err != nil {
		return err
	}
	if startupPID := conn.PgConn().PID(); startupPID != serverPID {
		return fmt.Errorf(errListenPooled, fmt.Sprintf("the session's pid %d is not the server's %d", startupPID, serverPID))
	}
	if _, err := conn.Exec(ctx, "SELECT pg_notify($1, 'settle-self-check')", channel); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, selfCheckTimeout)
	defer cancel()
	if _, err := conn.WaitForNotification(waitCtx); err != nil {
		if ctx.Err() == nil && waitCtx.Err() != nil {
			return fmt.Errorf(errListenPooled, "our own notification did not come back")
		}
		return err
	}
	return nil
}

func listenOnce(ctx context.Context, dsn, channel string, wake, connected func(), onProblem func(error)) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	// Whatever was committed while we were not listening is found by the
	// wake-up that follows a (re)connect.
	wake()
	if err := selfCheck(ctx, conn, channel); err != nil {
		onProblem(err)
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}
