package postgres

import (
	"context"
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
		err := listenOnce(ctx, dsn, channel, wake, func() { backoff = listenBackoffFirst })
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

func listenOnce(ctx context.Context, dsn, channel string, wake, connected func()) error {
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
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}
