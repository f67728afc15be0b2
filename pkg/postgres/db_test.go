package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
)

// TestOpenSaysWhyItGaveUp: while PostgreSQL does not answer, Open keeps
// trying until its context ends, and then says both why it stopped (a
// binary told to stop exits 0 on context.Canceled) and the last failure.
func TestOpenSaysWhyItGaveUp(t *testing.T) {
	port, err := devenv.FreePort() // nothing listens there
	require.NoError(t, err)
	dsn := fmt.Sprintf("postgres://settle@127.0.0.1:%d/settle?connect_timeout=1", port)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"canceled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(700*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 700*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			db, err := postgres.Open(ctx, dsn, postgres.Options{})
			require.Nil(t, db)
			require.ErrorIs(t, err, c.want)
			require.ErrorContains(t, err, "connection refused", "the last try's error is kept")
		})
	}
}
