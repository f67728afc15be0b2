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

// TestCheckURL: what Open would refuse is refused up front, saying what
// is wrong without the value, which holds the password.
func TestCheckURL(t *testing.T) {
	for _, good := range []string{
		"postgres://settle:hunter2@db:5432/settle?sslmode=require",
		"postgresql://settle@db/settle?pool_max_conns=8&default_query_exec_mode=cache_describe",
		"host=db user=settle password=hunter2 dbname=settle",
	} {
		require.NoError(t, postgres.CheckURL(good), good)
	}
	for _, c := range []struct{ url, want string }{
		{"postgres://settle:hunter2@db:notaport/settle", "invalid port"},
		{"postgres://settle:hunter2@db/settle?sslmode=sometimes", "sslmode is invalid"},
		{"http://settle:hunter2@db.example/settle", "keyword/value"},
		{"postgres://settle:hun%ter2@db/settle", "percent-encoded"},
		{"host=db password=hunter2 port=x", "invalid port"},
		{"postgres://settle:hunter2@db/settle?pool_max_conns=lots", "pool_max_conns"},
		// A space in an unquoted password: the driver quotes the word
		// after it ("missing \"=\" after \"hunter3\"").
		{"host=db user=settle password=hunter2 hunter3 dbname=settle", "keyword/value"},
		// Too short to tell from the driver's words: a generic answer.
		{"e", "not a PostgreSQL connection URL"},
	} {
		err := postgres.CheckURL(c.url)
		require.ErrorContains(t, err, c.want, c.url)
		for _, secret := range []string{"hunter2", "hunter3", "hun%ter2", "db.example", "@db"} {
			require.NotContains(t, err.Error(), secret, c.url)
		}
	}
}
