package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// outageServer is a PostgreSQL of the package's own for the tests that
// stop and start it, which the shared one must never be: started once
// (an initdb and a start cost seconds under -race), not per test.
var outageServer struct {
	once sync.Once
	pg   *devenv.Postgres
	err  error
	dbs  int
}

// outagePostgres hands t the package's outage server, running, and a
// fresh migrated database on it. The tests using it are not parallel:
// each stops the server under the others' feet.
func outagePostgres(t *testing.T) (*devenv.Postgres, string) {
	t.Helper()
	ctx := context.Background()
	outageServer.once.Do(func() {
		outageServer.pg, outageServer.err = devenv.StartPostgres(ctx, devenv.PostgresOptions{})
		if outageServer.err == nil {
			testenv.AtExit(outageServer.pg.Close)
		}
	})
	require.NoError(t, outageServer.err)
	pg := outageServer.pg
	// A test that failed during its outage left the server stopped.
	require.NoError(t, pg.Start(ctx))
	outageServer.dbs++
	name := fmt.Sprintf("outage_%d", outageServer.dbs)
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	migrator, err := postgres.Open(ctx, pg.URL(name), postgres.Options{ConnsMax: 2})
	require.NoError(t, err)
	defer migrator.Close()
	_, err = migrator.Migrate(ctx)
	require.NoError(t, err)
	return pg, pg.URL(name)
}
