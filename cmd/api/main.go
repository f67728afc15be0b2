// Command api is settle's HTTP service: signed webhooks in, balances and
// event status out, admin endpoints, health and metrics.
//
//	api           serve on HTTP_ADDR until SIGTERM/SIGINT
//	api migrate   apply pending migrations and exit
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/logging"
	notifyadmin "github.com/settle/settle/pkg/notify/admin"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/quicknode"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/service"
	"github.com/settle/settle/pkg/tracing"
)

const (
	serviceName            = "api"
	httpAddrDefault        = ":8080"
	shutdownTimeoutDefault = 30 * time.Second
	// startTimeout bounds connecting to PostgreSQL at start.
	startTimeout = time.Minute
	// migrateTimeoutDefault bounds `api migrate` (MIGRATE_TIMEOUT): a
	// migration such as 0003's concurrent index build takes as long as the
	// table is large, and one cut off is simply run again.
	migrateTimeoutDefault = 10 * time.Minute
	// unverifiedBytesCeiling bounds INGEST_UNVERIFIED_BYTES_MAX: more
	// memory than any api pod should hold for strangers.
	unverifiedBytesCeiling = 4 << 30
	// signingKeysMax bounds ALCHEMY_SIGNING_KEY's list.
	signingKeysMax = 64
	exitFailure    = 1
	exitUsage      = 2
)

func main() {
	os.Exit(run(os.Args[1:], config.FromOS(), os.Stderr))
}

// settings are the api's environment, read and checked in one go.
type settings struct {
	databaseURL     string
	redisURL        string
	logLevel        zerolog.Level
	shutdownTimeout time.Duration

	httpAddr      string
	adminAddr     string // set: the only listener of /admin/*, /metrics, /openapi.yaml
	webhookSecret string
	alchemyKeys   []string
	// quickNodeTokens and moralisSecrets open the other provider routes;
	// webhookMaxAge is QuickNode's replay window.
	quickNodeTokens []string
	moralisSecrets  []string
	webhookMaxAge   time.Duration
	apiToken        string
	adminToken      string
	rateLimit       httpapi.RateLimit
	trustedProxies  httpapi.TrustedProxies
	ingestBatchMax  int
	ingestInFlight  int
	handoff         handoffSettings
	// dashboardReadOnly hides asynqmon's delete/archive buttons.
	dashboardReadOnly bool
	// dashboardPrometheus feeds asynqmon's Metrics tab.
	dashboardPrometheus string
	// console configures /admin/console/.
	console consoleSettings
	// chain is the worker's chain settings; with ETH_RPC_URL the api can
	// ask the chain (recheck, Alchemy's removed).
	chain finality.Settings
	// registryRefresh (REGISTRY_REFRESH) bounds how stale the cached
	// networks and assets may be.
	registryRefresh time.Duration

	// migrateTimeout bounds `api migrate`.
	migrateTimeout time.Duration

	// verifiedRateLimit limits signed deliveries per client (rateLimit
	// counts the unverified ones); unverifiedBytesMax and
	// unverifiedClientBytesMax bound the bodies read before their
	// signature is checked.
	verifiedRateLimit httpapi.RateLimit
	providerBodyMax   int
	// readyWithoutRedis is READY_WITHOUT_REDIS.
	readyWithoutRedis        bool
	unverifiedBytesMax       int
	unverifiedClientBytesMax int
	// rescanBlocksMax bounds one POST /admin/rescan.
	rescanBlocksMax int
	// procsAdapt is PROCS_ADAPT.
	procsAdapt bool
}

// readCommon reads what every subcommand needs.
func readCommon(env *config.Env) settings {
	s := settings{
		databaseURL:     env.Required("DATABASE_URL"),
		logLevel:        config.Parse(env, "LOG_LEVEL", zerolog.InfoLevel, logging.ParseLevel),
		shutdownTimeout: env.Duration("SHUTDOWN_TIMEOUT", shutdownTimeoutDefault),
	}
	service.CheckDatabaseURL(env, "DATABASE_URL", s.databaseURL)
	return s
}

// readServe adds what serving needs.
func readServe(env *config.Env, s *settings) {
	s.redisURL = config.Parse(env, "REDIS_URL", service.RedisURLDefault, func(v string) (string, error) {
		_, err := redisconn.Parse(v)
		return v, err
	})
	s.httpAddr = config.Parse(env, "HTTP_ADDR", httpAddrDefault, config.ListenAddress)
	s.adminAddr = config.Parse(env, "ADMIN_ADDR", "", func(v string) (string, error) {
		if v == s.httpAddr {
			return "", errors.New("must differ from HTTP_ADDR")
		}
		return config.ListenAddress(v)
	})
	s.webhookSecret = env.Secret("WEBHOOK_SECRET", httpapi.SecretLengthMin)
	s.alchemyKeys = config.Parse(env, "ALCHEMY_SIGNING_KEY", nil, parseSigningKeys)
	s.quickNodeTokens = config.Parse(env, "QUICKNODE_SECURITY_TOKEN", nil, parseSigningKeys)
	s.moralisSecrets = config.Parse(env, "MORALIS_STREAM_SECRET", nil, parseSigningKeys)
	s.webhookMaxAge = env.Duration("WEBHOOK_MAX_AGE", quicknode.MaxAgeDefault)
	s.apiToken = env.Secret("API_TOKEN", httpapi.SecretLengthMin)
	s.adminToken = env.Secret("ADMIN_TOKEN", httpapi.SecretLengthMin)
	if s.apiToken != "" && s.apiToken == s.adminToken {
		// Otherwise every integrator holding the read token is an admin.
		config.Parse(env, "API_TOKEN", "", func(string) (string, error) {
			return "", errors.New("must differ from ADMIN_TOKEN")
		})
	}
	defaultLimit, err := httpapi.ParseRateLimit(httpapi.RateLimitDefault)
	if err != nil {
		panic(fmt.Sprintf("default rate limit %q: %v", httpapi.RateLimitDefault, err))
	}
	s.rateLimit = config.Parse(env, "WEBHOOK_RATE_LIMIT", defaultLimit, httpapi.ParseRateLimit)
	s.verifiedRateLimit = config.Parse(env, "WEBHOOK_VERIFIED_RATE_LIMIT", nil, httpapi.ParseRateLimit)
	// The budget must hold one body of the largest route, whose
	// reservation may be its whole limit, twice for a gzip body (the wire
	// bytes and what they inflate to).
	s.providerBodyMax = env.Int("PROVIDER_BODY_MAX", httpapi.ProviderBodyMaxDefault, httpapi.ProviderBodyMaxFloor, httpapi.ProviderBodyMaxCeiling)
	// Unset, the budget grows with a raised provider limit; set, it must
	// hold two such bodies.
	s.unverifiedBytesMax = env.Int("INGEST_UNVERIFIED_BYTES_MAX", max(httpapi.UnverifiedBytesMaxDefault, 2*s.providerBodyMax), 2*httpapi.ProviderBodyMaxFloor, unverifiedBytesCeiling)
	if s.unverifiedBytesMax < 2*s.providerBodyMax {
		env.Reject("INGEST_UNVERIFIED_BYTES_MAX", fmt.Errorf("%d is less than twice PROVIDER_BODY_MAX (%d)", s.unverifiedBytesMax, s.providerBodyMax))
	}
	s.unverifiedClientBytesMax = env.Int("INGEST_UNVERIFIED_CLIENT_BYTES_MAX", int(httpapi.UnverifiedClientShareDefault(int64(s.providerBodyMax), int64(s.unverifiedBytesMax))), httpapi.PaymentsBodyMax, unverifiedBytesCeiling)
	if s.unverifiedClientBytesMax > s.unverifiedBytesMax {
		env.Reject("INGEST_UNVERIFIED_CLIENT_BYTES_MAX", fmt.Errorf("%d is more than INGEST_UNVERIFIED_BYTES_MAX (%d)", s.unverifiedClientBytesMax, s.unverifiedBytesMax))
	}
	s.ingestBatchMax = env.Int("INGEST_BATCH_MAX", postgres.IngestBatchMaxDefault, 1, postgres.LedgerBatchMax)
	s.ingestInFlight = env.Int("INGEST_IN_FLIGHT", postgres.IngestInFlightMaxDefault, 1, 64)
	s.handoff = readHandoff(env)
	s.dashboardReadOnly = env.Bool("QUEUE_DASHBOARD_READ_ONLY", true)
	s.readyWithoutRedis = env.Bool("READY_WITHOUT_REDIS", false)
	s.dashboardPrometheus = readDashboardPrometheus(env)
	s.rescanBlocksMax = env.Int("RESCAN_BLOCKS_MAX", httpapi.RescanBlocksMaxDefault, 1, 10_000_000)
	s.console = readConsole(env, s.adminToken, s.apiToken)
	s.trustedProxies = config.Parse(env, "TRUSTED_PROXIES", nil, httpapi.ParseTrustedProxies)
	s.chain = finality.ReadSettings(env, false)
	s.registryRefresh = env.Duration("REGISTRY_REFRESH", service.RegistryRefreshDefault)
	s.procsAdapt = service.ReadProcsAdapt(env)
}

// parseSigningKeys reads a comma-separated list; each key is used as its
// literal bytes (whsec_ prefix included), so only surrounding spaces are
// dropped.
func parseSigningKeys(v string) ([]string, error) {
	var keys []string
	for _, key := range strings.Split(v, ",") {
		key = strings.TrimSpace(key)
		if key == "" {
			return nil, errors.New("the list has an empty key")
		}
		keys = append(keys, key)
	}
	if len(keys) > signingKeysMax {
		return nil, fmt.Errorf("more than %d keys", signingKeysMax)
	}
	return keys, nil
}

func run(args []string, env *config.Env, stderr io.Writer) int {
	command, s := readArgs(args, env)
	if command == "" {
		fmt.Fprintf(stderr, "%s: usage: api [migrate]\n", serviceName)
		return exitUsage
	}
	if line := service.SettingsProblems(serviceName, env); line != "" {
		fmt.Fprintln(stderr, line)
		return exitFailure
	}
	log := logging.NewTo(stderr, serviceName, s.logLevel)

	var err error
	if command == "migrate" {
		err = migrate(log, s)
	} else {
		stopAdapting := service.TuneRuntime(s.procsAdapt, log)
		endTracing := tracing.Begin(serviceName, log)
		err = serve(log, s)
		stopAdapting()
		endTracing()
	}
	if err != nil {
		log.Error().Err(err).Msg("api stopped")
		return exitFailure
	}
	return 0
}

func migrate(log zerolog.Logger, s settings) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, s.migrateTimeout)
	defer cancel()
	timedOut := func(err error) error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("migrations not done within MIGRATE_TIMEOUT (%s); run again, applied migrations stay applied: %w", s.migrateTimeout, err)
		}
		return err
	}
	db, err := postgres.Open(ctx, s.databaseURL, postgres.Options{ConnsMax: 2, ApplicationName: "settle-api-migrate"})
	if err != nil {
		return timedOut(err)
	}
	defer db.Close()
	applied, err := db.Migrate(ctx)
	if err != nil {
		return timedOut(err)
	}
	log.Info().Strs("applied", applied).Int("schema_version", postgres.LatestSchemaVersion()).Msg("migrations done")
	return nil
}

func serve(log zerolog.Logger, s settings) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	defer func() {
		// Told to stop while still starting (waiting for PostgreSQL, say):
		// nothing was taken in, so that is a clean stop, as service.Main
		// has it for worker and scheduler.
		if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			log.Info().Err(err).Msg("api stopped by a signal before it was ready")
			err = nil
		}
	}()

	openCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	db, err := postgres.Open(openCtx, s.databaseURL, postgres.Options{ApplicationName: "settle-api"})
	if err != nil {
		return err
	}
	defer db.Close()
	// Before migrations there is no registry to check NETWORKS against;
	// worker and scheduler, which wait for the schema, check it then.
	if registry, err := db.Assets(openCtx); err == nil {
		if err := s.chain.CheckListed(registry); err != nil {
			return err
		}
	}
	rdb, err := redisconn.Open(s.redisURL)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	defer func() { _ = rdb.Close() }()
	registry := service.Registry()
	// Webhooks commit in groups: one multi-row insert, one commit, one
	// fsync for every webhook waiting at that moment; a trickle's commit
	// also hands its events to the queue.
	ingest := postgres.NewIngestWith(db, postgres.IngestOptions{BatchMax: s.ingestBatchMax, InFlightMax: s.ingestInFlight,
		Handoff: s.handoff.open(db, rdb, log, registry)})
	defer ingest.Close()

	registry.MustRegister(db.Collector())
	chain, closeChain, err := openChain(ctx, openCtx, s, db, rdb, log, registry)
	if err != nil {
		return err
	}
	defer closeChain()
	rescans := &serverRescans{}
	operatorConsole, err := consoleMount(s, db, rdb, chain, rescans)
	if err != nil {
		return err
	}
	server, err := httpapi.New(httpapi.Options{
		Chain:              chain,
		Rechecks:           outbox.NewRecheckQueue(rdb),
		Networks:           s.chain.NetworkNames(),
		RegistryRefresh:    s.registryRefresh,
		Registry:           registry,
		Store:              groupCommit{DB: db, ingest: ingest},
		Redis:              rdb,
		Log:                log,
		WebhookSecret:      s.webhookSecret,
		AlchemySigningKeys: s.alchemyKeys,
		QuickNodeTokens:    s.quickNodeTokens,
		MoralisSecrets:     s.moralisSecrets,
		WebhookMaxAge:      s.webhookMaxAge,
		APIToken:           s.apiToken,
		AdminToken:         s.adminToken,
		RateLimit:          s.rateLimit,
		VerifiedRateLimit:  s.verifiedRateLimit,
		TrustedProxies:     s.trustedProxies,
		AdminRoutes:        append(adminapi.Routes(db), notifyadmin.Routes(db)...),
		AdminMounts:        []httpapi.Mount{adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: s.dashboardReadOnly, PrometheusURL: s.dashboardPrometheus}), operatorConsole},

		UnverifiedBytesMax:       int64(s.unverifiedBytesMax),
		ProviderBodyMax:          int64(s.providerBodyMax),
		ReadyWithoutRedis:        s.readyWithoutRedis,
		UnverifiedClientBytesMax: int64(s.unverifiedClientBytesMax),
		RescanBlocksMax:          int64(s.rescanBlocksMax),
	})
	if err != nil {
		return err
	}
	rescans.server = server
	listener, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR: %w", err)
	}
	var adminListener net.Listener
	adminAddr := "" // empty in the log line: the public listener serves all
	if s.adminAddr != "" {
		if adminListener, err = net.Listen("tcp", s.adminAddr); err != nil {
			_ = listener.Close()
			return fmt.Errorf("ADMIN_ADDR: %w", err)
		}
		adminAddr = adminListener.Addr().String()
	}
	log.Info().Str("addr", listener.Addr().String()).Str("admin_addr", adminAddr).Str("rate_limit", s.rateLimit.String()).Str("verified_rate_limit", s.verifiedRateLimit.String()).
		Int("trusted_proxies", len(s.trustedProxies)).Bool("alchemy", len(s.alchemyKeys) > 0).
		Bool("chain_rpc", s.chain.HasRPC()).Msg("api serving")
	if err := server.ServeSplit(ctx, listener, adminListener, s.shutdownTimeout); err != nil {
		return err
	}
	log.Info().Msg("api stopped cleanly")
	return nil
}

// groupCommit is the database with InsertEvent going through the group
// committer.
type groupCommit struct {
	*postgres.DB
	ingest *postgres.Ingest
}

func (g groupCommit) InsertEvent(ctx context.Context, e postgres.NewEvent) (bool, error) {
	return g.ingest.InsertEvent(ctx, e)
}
