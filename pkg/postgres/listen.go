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

// The listener's bounds. Its context has no deadline: a PostgreSQL that
// stops answering without a reset (failover, partition) held a connect
// or a statement, or a quiet session's wait, until the kernel gave the
// socket up, many minutes with wake-ups left to the poll.
const (
	// listenConnectTimeout is Open's, unless the DSN sets connect_timeout.
	listenConnectTimeout = 5 * time.Second
	// listenCallTimeout bounds each statement of the session.
	listenCallTimeout = 5 * time.Second
	// listenQuietMax is how long a session waits for a notification
	// before it makes sure PostgreSQL still answers (one round trip).
	listenQuietMax = time.Minute
)

// listenBounds are the listener's bounds (tests shorten them).
type listenBounds struct{ connect, call, quiet time.Duration }

// Listen holds one dedicated connection LISTENing on channel and calls
// wake for every notification until ctx ends; a lost connection is
// re-established with bounded backoff (the caller's poll covers the gap).
// LISTEN is session state: behind PgBouncer in transaction pooling, point
// dsn at PostgreSQL directly.
func Listen(ctx context.Context, dsn, channel string, wake func(), onError func(error)) {
	listen(ctx, dsn, channel, wake, onError, listenBounds{connect: listenConnectTimeout, call: listenCallTimeout, quiet: listenQuietMax})
}

func listen(ctx context.Context, dsn, channel string, wake func(), onError func(error), b listenBounds) {
	backoff := listenBackoffFirst
	for ctx.Err() == nil {
		err := listenOnce(ctx, dsn, channel, wake, func() { backoff = listenBackoffFirst }, onError, b)
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
func selfCheck(ctx context.Context, conn *pgx.Conn, channel string, callTimeout time.Duration) error {
	var serverPID uint32
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	err := conn.QueryRow(callCtx, "SELECT pg_backend_pid()").Scan(&serverPID)
	cancel()
	if err != nil {
		return err
	}
	if startupPID := conn.PgConn().PID(); startupPID != serverPID {
		return fmt.Errorf(errListenPooled, fmt.Sprintf("the session's pid %d is not the server's %d", startupPID, serverPID))
	}
	callCtx, cancel = context.WithTimeout(ctx, callTimeout)
	_, err = conn.Exec(callCtx, "SELECT pg_notify($1, 'settle-self-check')", channel)
	cancel()
	if err != nil {
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

func listenOnce(ctx context.Context, dsn, channel string, wake, connected func(), onProblem func(error), b listenBounds) error {
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	if config.ConnectTimeout == 0 {
		config.ConnectTimeout = b.connect
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.call)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	callCtx, cancel := context.WithTimeout(ctx, b.call)
	_, err = conn.Exec(callCtx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	cancel()
	if err != nil {
		return err
	}
	connected()
	// Whatever was committed while we were not listening is found by the
	// wake-up that follows a (re)connect.
	wake()
	if err := selfCheck(ctx, conn, channel, b.call); err != nil {
		onProblem(err)
	}
	for {
		waitCtx, cancel := context.WithTimeout(ctx, b.quiet)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		if err == nil {
			wake()
			continue
		}
		if ctx.Err() != nil || waitCtx.Err() == nil {
			return err
		}
		// Quiet for a while: a wait's timeout leaves the session usable,
		// and one round trip tells a quiet PostgreSQL from a gone one.
		pingCtx, cancel := context.WithTimeout(ctx, b.call)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return err
		}
	}
}
