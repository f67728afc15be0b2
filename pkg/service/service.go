// Package service holds what every settle binary does the same way:
// common settings, the logger, signal handling and exit codes.
package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/buildinfo"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/opsserver"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/procs"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/tracing"
)

// Exit codes.
const (
	ExitSettings = 2 // a missing or invalid setting
	ExitFailure  = 1 // a failure while running
)

// ShutdownTimeoutDefault bounds a graceful stop.
const ShutdownTimeoutDefault = 30 * time.Second

// StartTimeout bounds waiting for PostgreSQL at start.
const StartTimeout = time.Minute

// Common are the settings every long-running binary reads.
type Common struct {
	DatabaseURL     string
	RedisURL        string
	LogLevel        zerolog.Level
	ShutdownTimeout time.Duration
	// RegistryRefresh (REGISTRY_REFRESH) is how soon a running process
	// sees a network or asset an operator added.
	RegistryRefresh time.Duration
}

// RedisURLDefault is REDIS_URL's default.
const RedisURLDefault = "redis://localhost:6379/0"

// RegistryRefreshDefault is REGISTRY_REFRESH's default.
const RegistryRefreshDefault = 30 * time.Second

// ReadCommon reads the shared settings.
func ReadCommon(env *config.Env) Common {
	c := Common{
		DatabaseURL:     env.Required("DATABASE_URL"),
		RedisURL:        env.String("REDIS_URL", RedisURLDefault),
		LogLevel:        config.Parse(env, "LOG_LEVEL", zerolog.InfoLevel, logging.ParseLevel),
		ShutdownTimeout: env.Duration("SHUTDOWN_TIMEOUT", ShutdownTimeoutDefault),
		RegistryRefresh: env.Duration("REGISTRY_REFRESH", RegistryRefreshDefault),
	}
	if _, err := redisconn.Parse(c.RedisURL); err != nil {
		env.Reject("REDIS_URL", err)
	}
	CheckDatabaseURL(env, "DATABASE_URL", c.DatabaseURL)
	return c
}

// CheckDatabaseURL rejects the setting name unless url (when set) is a
// connection string PostgreSQL's driver accepts, so a typo stops the
// binary at once rather than fail or retry forever after it started. The
// error does not repeat the value, which holds the password.
func CheckDatabaseURL(env *config.Env, name, url string) {
	if url == "" {
		return
	}
	if err := postgres.CheckURL(url); err != nil {
		env.Reject(name, err)
	}
}

// ExitOnSettingsError prints every bad setting on one line and exits.
func ExitOnSettingsError(binary string, env *config.Env) {
	if line := SettingsProblems(binary, env); line != "" {
		fmt.Fprintln(os.Stderr, line)
		os.Exit(ExitSettings)
	}
}

// SettingsProblems is the one line that names every bad setting at once
// (so an operator fixes them in one go), or "" when there is none.
func SettingsProblems(binary string, env *config.Env) string {
	errs := env.Errs()
	if len(errs) == 0 {
		return ""
	}
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = err.Error()
	}
	return binary + ": " + strings.Join(lines, "; ")
}

// Main is the main of a long-running binary that takes its settings from
// the environment only: read them (exit 2 naming every bad one), make
// the logger, run, exit 1 if run fails.
func Main[S any](binary string, read func(*config.Env) S, level func(S) zerolog.Level, run func(S, zerolog.Logger) error) {
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "%s: unknown argument %q (settings come from the environment only)\n", binary, os.Args[1])
		os.Exit(ExitSettings)
	}
	env := config.FromOS()
	s := read(env)
	adapt := ReadProcsAdapt(env)
	ExitOnSettingsError(binary, env)
	log := logging.New(binary, level(s))
	defer TuneRuntime(adapt, log)()
	endTracing := tracing.Begin(binary, log)
	// A signal seen here too: a run that ends canceled because it was told
	// to stop (still waiting for PostgreSQL at start, say) stopped cleanly.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	err := run(s, log)
	endTracing()
	if err != nil && errors.Is(err, context.Canceled) && len(signals) > 0 {
		log.Info().Err(err).Msg(binary + " stopped by a signal before it was ready")
		return
	}
	if err != nil {
		log.Error().Err(err).Msg(binary + " failed")
		os.Exit(ExitFailure)
	}
}

// ReadProcsAdapt reads PROCS_ADAPT: run on one P while nearly idle (on by
// default; see package procs).
func ReadProcsAdapt(env *config.Env) bool { return env.Bool("PROCS_ADAPT", true) }

// TuneRuntime sets the garbage collector's default (procs.TuneGC) and
// runs procs.Run in the background unless adapting is off or the
// operator chose GOMAXPROCS; the returned func stops it.
func TuneRuntime(adapt bool, log zerolog.Logger) (stop func()) {
	procs.TuneGC(os.Getenv)
	if !adapt || !procs.Applies(os.Getenv) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		procs.Run(ctx, procs.Options{OnChange: func(n int) {
			log.Debug().Int("gomaxprocs", n).Msg("GOMAXPROCS adapted to the load")
		}})
	}()
	return func() {
		cancel()
		<-done
	}
}

// SignalContext ends on SIGTERM or SIGINT.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// Registry is a Prometheus registry with the process and Go collectors
// and settle_build_info.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector(), buildinfo.Collector())
	return reg
}

// How a binary waits for migrations at start: it asks every schemaPoll
// (each ask bounded by schemaCheckTimeout) and says so every
// schemaLogEvery.
const (
	schemaPoll         = 2 * time.Second
	schemaCheckTimeout = 5 * time.Second
	schemaLogEvery     = 30 * time.Second
)

// WaitForSchema returns once every migration this binary carries is
// applied, or with ctx's error. A worker or scheduler started next to its
// migration (or after one that failed) would otherwise meet missing tables
// in every task and job. It waits as long as it takes: a migration may
// build an index for minutes, and /readyz (started before) says
// "pending" meanwhile.
func WaitForSchema(ctx context.Context, db *postgres.DB, log zerolog.Logger) error {
	var lastLog time.Time
	for waited := false; ; waited = true {
		checkCtx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
		current, err := db.SchemaCurrent(checkCtx)
		var version int
		if err == nil && !current {
			version, err = db.SchemaVersion(checkCtx)
		}
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for migrations: %w", ctx.Err())
		}
		if err == nil && current {
			if waited {
				log.Info().Int("schema_version", postgres.LatestSchemaVersion()).Msg("database schema is current; starting")
			}
			return nil
		}
		if time.Since(lastLog) >= schemaLogEvery {
			lastLog = time.Now()
			if err != nil {
				log.Warn().Err(err).Msg("cannot read the schema version; waiting for the database before taking any work")
			} else {
				log.Warn().Int("schema_version", version).Int("needs", postgres.LatestSchemaVersion()).
					Msg("database schema is behind this binary: waiting before taking any work; run `api migrate` (or `settlectl migrate`)")
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for migrations: %w", ctx.Err())
		case <-time.After(schemaPoll):
		}
	}
}

// ReadyCheck is /readyz of the worker and the scheduler: PostgreSQL and
// Redis answer, and the schema is the one this binary expects. Every
// dependency is checked, so the answer names all that are down.
func ReadyCheck(db *postgres.DB, rdb redis.UniversalClient) opsserver.Ready {
	return func(ctx context.Context) (map[string]string, error) {
		checks := map[string]string{"postgres": "ok", "redis": "ok", "migrations": "current"}
		var errs []error
		if err := db.Ping(ctx); err != nil {
			checks["postgres"], checks["migrations"] = "unreachable", "unknown"
			errs = append(errs, fmt.Errorf("postgres: %w", err))
		} else if current, err := db.SchemaCurrent(ctx); err != nil {
			checks["migrations"] = "unknown"
			errs = append(errs, fmt.Errorf("schema version: %w", err))
		} else if !current {
			checks["migrations"] = "pending"
			errs = append(errs, errors.New("database schema is behind this binary: run `api migrate`"))
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			checks["redis"] = "unreachable"
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
		return checks, errors.Join(errs...)
	}
}
