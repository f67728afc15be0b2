// Package testenv gives tests real PostgreSQL and Redis: one throwaway
// server of each per `go test` package run (or the ones named by
// TEST_DATABASE_URL and TEST_REDIS_URL), and an isolated, migrated
// database and a private Redis database per test.
package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/postgres"
)

const (
	templateDatabase = "settle_template"
	// redisDatabases is how many logical databases our own Redis offers;
	// each test takes a fresh one.
	redisDatabases = 4096
	setupTimeout   = 2 * time.Minute
)

type environment struct {
	adminURL string // a DSN whose database we may create databases from
	redisURL string
	pg       *devenv.Postgres
	rds      *devenv.Redis

	templateOnce sync.Once
	templateErr  error
	cloneMu      sync.Mutex
	dbCounter    atomic.Int64
	redisCounter atomic.Int64
	redisDBMax   int
}

var (
	env     *environment
	envErr  error
	envOnce sync.Once
)

// Main runs a package's tests around one shared environment and tears it
// down afterwards. Use it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	atExitMu.Lock()
	for _, f := range atExit {
		f()
	}
	atExitMu.Unlock()
	if env != nil {
		if env.pg != nil {
			env.pg.Close()
		}
		if env.rds != nil {
			env.rds.Close()
		}
	}
	os.Exit(code)
}

var (
	atExitMu sync.Mutex
	atExit   []func()
)

// AtExit runs f when Main ends, after the package's tests: where test
// helpers remove what lives for the whole package (built binaries).
func AtExit(f func()) {
	atExitMu.Lock()
	defer atExitMu.Unlock()
	atExit = append(atExit, f)
}

func shared(t testing.TB) *environment {
	t.Helper()
	envOnce.Do(func() { env, envErr = setup() })
	if envErr != nil {
		t.Fatalf("test environment: %v", envErr)
	}
	return env
}

func setup() (*environment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	e := &environment{}
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		e.adminURL = u
	} else {
		pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
		if err != nil {
			return nil, err
		}
		e.pg, e.adminURL = pg, pg.URL("postgres")
	}
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		e.redisURL = u
		e.redisDBMax = redisDatabaseCount(ctx, u)
	} else {
		rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{Databases: redisDatabases})
		if err != nil {
			if e.pg != nil {
				e.pg.Close()
			}
			return nil, err
		}
		e.rds, e.redisURL, e.redisDBMax = rds, rds.URL(0), redisDatabases
	}
	return e, nil
}

func redisDatabaseCount(ctx context.Context, rawURL string) int {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return 16
	}
	c := redis.NewClient(opts)
	defer c.Close()
	got, err := c.ConfigGet(ctx, "databases").Result()
	if err != nil {
		return 16
	}
	n, err := strconv.Atoi(got["databases"])
	if err != nil || n < 2 {
		return 16
	}
	return n
}

// Postgres is the harness's own server, or nil when TEST_DATABASE_URL names
// an external one; chaos tests use it to stop, pause and restart.
func Postgres(t testing.TB) *devenv.Postgres { return shared(t).pg }

// Redis is the harness's own Redis server, or nil when external.
func Redis(t testing.TB) *devenv.Redis { return shared(t).rds }

// withDatabase swaps the database name in a DSN.
func withDatabase(dsn, name string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

func (e *environment) template(ctx context.Context) error {
	e.templateOnce.Do(func() {
		e.templateErr = func() error {
			admin, err := pgx.Connect(ctx, e.adminURL)
			if err != nil {
				return err
			}
			defer admin.Close(ctx)
			// A template left by an interrupted run is rebuilt.
			if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+templateDatabase+" WITH (FORCE)"); err != nil {
				return err
			}
			if _, err := admin.Exec(ctx, "CREATE DATABASE "+templateDatabase); err != nil {
				return err
			}
			templateURL, err := withDatabase(e.adminURL, templateDatabase)
			if err != nil {
				return err
			}
			db, err := postgres.Open(ctx, templateURL, postgres.Options{ConnsMax: 2})
			if err != nil {
				return err
			}
			defer db.Close()
			_, err = db.Migrate(ctx)
			return err
		}()
	})
	return e.templateErr
}

// DatabaseURL creates a fresh, migrated database for t and drops it when
// t ends. Subprocesses get it through DATABASE_URL.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	e := shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := e.template(ctx); err != nil {
		t.Fatalf("template database: %v", err)
	}
	name := fmt.Sprintf("settle_test_%d_%d", os.Getpid(), e.dbCounter.Add(1))
	admin, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		t.Fatalf("connect admin: %v", err)
	}
	defer admin.Close(ctx)
	// Cloning a template refuses concurrent clones of the same template.
	e.cloneMu.Lock()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+templateDatabase)
	e.cloneMu.Unlock()
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	// A clone does not inherit the template's per-database settings (the
	// migrations set some): copy them.
	_, err = admin.Exec(ctx, `DO $$
		DECLARE setting text;
		BEGIN
			FOR setting IN SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
			               WHERE d.datname = '`+templateDatabase+`' AND s.setrole = 0 LOOP
				EXECUTE format('ALTER DATABASE %I SET %s = %L', '`+name+`', split_part(setting, '=', 1), substr(setting, strpos(setting, '=') + 1));
			END LOOP;
		END $$`)
	if err != nil {
		t.Fatalf("copy database settings: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, e.adminURL)
		if err != nil {
			return // the server may be gone already (chaos tests)
		}
		defer admin.Close(ctx)
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	dsn, err := withDatabase(e.adminURL, name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// EmptyDatabaseURL creates an empty, unmigrated database for t (tests of
// migrations populate it at an older schema version first).
func EmptyDatabaseURL(t testing.TB) string {
	t.Helper()
	e := shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	name := fmt.Sprintf("settle_empty_%d_%d", os.Getpid(), e.dbCounter.Add(1))
	admin, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		t.Fatalf("connect admin: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgx.Connect(ctx, e.adminURL); err == nil {
			defer admin.Close(ctx)
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
	})
	dsn, err := withDatabase(e.adminURL, name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// DB opens a pool on a fresh database for t.
func DB(t testing.TB) *postgres.DB {
	t.Helper()
	return OpenDB(t, DatabaseURL(t))
}

// OpenDB opens a pool on dsn, closed when t ends.
func OpenDB(t testing.TB, dsn string) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn, postgres.Options{ConnsMax: 20, ApplicationName: "settle-test"})
	if err != nil {
		t.Fatalf("open database: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

// RedisURL hands t a private, empty Redis database.
func RedisURL(t testing.TB) string {
	t.Helper()
	e := shared(t)
	n := int(e.redisCounter.Add(1))
	db := 1 + (n-1)%(e.redisDBMax-1) // database 0 is left alone
	u, err := url.Parse(e.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + strconv.Itoa(db)
	dsn := u.String()
	opts, err := redis.ParseURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		t.Fatalf("flush redis db %d: %v", db, err)
	}
	return dsn
}

// Env returns the environment a subprocess needs, with the settings given.
func Env(settings map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if _, overridden := settings[name]; !overridden {
			out = append(out, kv)
		}
	}
	for k, v := range settings {
		out = append(out, k+"="+v)
	}
	return out
}
