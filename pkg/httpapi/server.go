// Package httpapi is settle's HTTP door (the api binary): signed webhooks
// in, balances and event status out, admin endpoints, health and metrics.
// Echo stays inside this package; routes other packages contribute (the
// DLQ, the queue dashboard) are plain net/http handlers.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/quicknode"
)

// Limits of the HTTP server. Webhook bodies have their own limits.
const (
	// SecretLengthMin is the shortest WEBHOOK_SECRET, API_TOKEN or
	// ADMIN_TOKEN accepted.
	SecretLengthMin = 32
	// storeTimeout bounds the storage work of one request; past it the
	// caller gets a 503 and retries.
	storeTimeout      = 5 * time.Second
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	headerBytesMax    = 64 << 10
	// adminBodyMax bounds admin request bodies, including those of routes
	// other packages contribute.
	adminBodyMax = 64 << 10
)

// Store is what the API needs from storage; *postgres.DB implements it.
type Store interface {
	// The provider intake's: events, owners, reports, reorg reports.
	intake.Store
	Event(ctx context.Context, id string) (postgres.EventView, error)
	Balances(ctx context.Context, user int64) ([]postgres.Balance, error)
	HoldEventOf(ctx context.Context, holdID string) (postgres.HoldEvent, bool, error)
	Hold(ctx context.Context, holdID string) (postgres.Hold, error)
	EventsPage(ctx context.Context, f postgres.EventFilter, after *postgres.EventKey, size int) (postgres.Page[postgres.EventView, postgres.EventKey], error)
	JournalPage(ctx context.Context, user int64, asset string, after *postgres.JournalKey, size int) (postgres.Page[postgres.JournalEntry, postgres.JournalKey], error)
	UserExists(ctx context.Context, id int64) (bool, error)
	CreateUser(ctx context.Context, id int64) (bool, error)
	Assets(ctx context.Context) (*payment.Registry, error)
	// ReportedRPCs are the networks a worker can ask the chain of.
	ReportedRPCs(ctx context.Context) (map[string]bool, error)
	// A recheck handed to the workers: the event asked about, and the
	// record its answer is read from.
	RecheckTarget(ctx context.Context, eventID string) (postgres.RecheckTarget, error)
	LastRecheckID(ctx context.Context, eventID string) (int64, error)
	RecheckAfter(ctx context.Context, eventID string, after int64, who string) (postgres.Recheck, bool, error)
	AddNetwork(ctx context.Context, n postgres.NewNetwork) (bool, error)
	AddAsset(ctx context.Context, a payment.Asset) (bool, error)
	AddDepositAddress(ctx context.Context, network, address string, user int64) (bool, error)
	Ping(ctx context.Context) error
	SchemaCurrent(ctx context.Context) (bool, error)
}

var _ Store = (*postgres.DB)(nil)

// Route is an admin endpoint contributed by another package (the DLQ
// endpoints). It runs behind the admin token, and must be described in
// openapi.yaml with x-settle-plugin: true; New refuses it otherwise, so
// the spec cannot fall behind. Path uses echo syntax ("/admin/dlq/:id");
// the handler reads parameters with PathParam.
type Route struct {
	Method  string
	Path    string
	Handler http.Handler
}

// Mount serves a whole subtree under the admin token (the asynqmon
// dashboard at /admin/queues/). Browsers cannot send a bearer header, so
// HTTP Basic with the admin token as password is accepted on mounts.
type Mount struct {
	// Prefix ends with "/", e.g. "/admin/queues/".
	Prefix  string
	Handler http.Handler
	// Authenticates: the handler checks credentials itself (the console,
	// which knows a read-only role); the mount still serves only on the
	// admin listener.
	Authenticates bool
}

// mountMethods are the methods a Mount answers (what a dashboard uses).
var mountMethods = []string{http.MethodGet, http.MethodPost, http.MethodDelete}

// Options configure a Server.
type Options struct {
	Store Store
	// Redis holds the shared rate-limit counters; /healthz reports it.
	Redis redis.UniversalClient
	Log   zerolog.Logger
	// Registry receives the API's metrics and is served at /metrics; nil
	// makes a new one with the Go and process collectors.
	Registry *prometheus.Registry

	// WebhookSecret signs /webhook/payments (at least SecretLengthMin).
	WebhookSecret string
	// AlchemySigningKeys sign /webhook/alchemy; none: the route is a 404.
	AlchemySigningKeys []string
	// QuickNodeTokens sign /webhook/quicknode, MoralisSecrets
	// /webhook/moralis; none: the route is a 404. WebhookMaxAge is
	// QuickNode's replay window (zero: quicknode.MaxAgeDefault).
	QuickNodeTokens []string
	MoralisSecrets  []string
	WebhookMaxAge   time.Duration
	// APIToken opens /v1; AdminToken opens /admin and /v1.
	APIToken   string
	AdminToken string

	// RateLimit applies per client to webhooks whose signature is missing
	// or wrong (WEBHOOK_RATE_LIMIT); VerifiedRateLimit to verified ones
	// (WEBHOOK_VERIFIED_RATE_LIMIT). Empty is off.
	RateLimit         RateLimit
	VerifiedRateLimit RateLimit
	// UnverifiedBytesMax bounds the body bytes of webhooks not yet
	// verified, across the process; UnverifiedClientBytesMax one client's
	// part of it. Zero: the defaults.
	UnverifiedBytesMax       int64
	UnverifiedClientBytesMax int64
	// ReadyWithoutRedis leaves Redis out of /readyz (READY_WITHOUT_REDIS).
	ReadyWithoutRedis bool
	// ProviderBodyMax bounds a provider delivery's body, after
	// decompression (PROVIDER_BODY_MAX); zero: ProviderBodyMaxDefault.
	ProviderBodyMax int64
	// RateLimitTimeout bounds a limiter call to Redis, past which the
	// in-process fallback decides; zero: RateLimitTimeoutDefault.
	RateLimitTimeout time.Duration
	TrustedProxies   TrustedProxies

	AdminRoutes []Route
	AdminMounts []Mount

	// Networks are the enabled networks (NETWORKS); empty: ETH_MAINNET.
	Networks []string
	// RegistryRefresh (REGISTRY_REFRESH) bounds how old the cached
	// registry of networks and assets may be; zero: the default.
	RegistryRefresh time.Duration

	// Chain asks the chain about deposits (the recheck; Alchemy's removed
	// is then a reason to ask, not evidence, on the networks it has an RPC
	// for); nil: no RPC on any network.
	Chain Chain
	// Rechecks hands a recheck on a network the api has no RPC for to the
	// workers, when one of them reported an RPC there; nil: it answers
	// 409 as before.
	Rechecks RecheckQueue

	// RescanBlocksMax bounds one POST /admin/rescan (RESCAN_BLOCKS_MAX);
	// zero: RescanBlocksMaxDefault.
	RescanBlocksMax int64

	// Now is the clock of the rate limiter (tests fix it); nil: time.Now.
	Now func() time.Time
}

// Server is the API.
type Server struct {
	rescanMax int64 // Options.RescanBlocksMax

	echo    *echo.Echo
	store   Store
	redis   redis.UniversalClient
	log     zerolog.Logger
	metrics *metrics
	assets  *assetCache
	// rpcReports: the networks a worker reported an RPC on.
	rpcReports *rpcReportCache
	networks   map[string]bool
	proxies    TrustedProxies
	chain      Chain
	rechecks   RecheckQueue
	intake     *intake.Intake

	webhookSecret []byte
	alchemyKeys   [][]byte
	// Provider routes' secrets, replay window, chain ids and clock.
	quickNodeTokens [][]byte
	moralisSecrets  [][]byte
	webhookMaxAge   time.Duration
	providerBodyMax int64
	now             func() time.Time
	readers         []tokenDigest
	admins          []tokenDigest

	// unverifiedLimit and verifiedLimit are nil when off.
	unverifiedLimit *limiter
	verifiedLimit   *limiter
	unverified      *unverifiedBytes
	// quickNodeReplays remembers verified QuickNode deliveries over
	// their replay window.
	quickNodeReplays *replayGuard

	// routes holds every registered route template, quietRoutes those
	// logged at debug level (probes and scrapes).
	routes      map[string]bool
	quietRoutes map[string]bool
	stopping    atomic.Bool
	// redisUp is Redis's state for /healthz, /readyz and settle_redis_up.
	redisUp           *redisProbe
	readyWithoutRedis bool
}

// New checks the options and builds the routes.
func New(opts Options) (*Server, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("httpapi: Store is required")
	case opts.Redis == nil:
		return nil, errors.New("httpapi: Redis is required")
	case len(opts.WebhookSecret) < SecretLengthMin:
		return nil, fmt.Errorf("httpapi: webhook secret must be at least %d characters", SecretLengthMin)
	case len(opts.APIToken) < SecretLengthMin || len(opts.AdminToken) < SecretLengthMin:
		return nil, fmt.Errorf("httpapi: API and admin tokens must be at least %d characters", SecretLengthMin)
	}
	for _, key := range opts.AlchemySigningKeys {
		if key == "" {
			return nil, errors.New("httpapi: empty Alchemy signing key")
		}
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	registry, addRuntime := opts.Registry, false
	if registry == nil {
		registry, addRuntime = prometheus.NewRegistry(), true
	}
	s := &Server{
		echo:          echo.New(),
		store:         opts.Store,
		redis:         opts.Redis,
		log:           opts.Log,
		metrics:       newMetrics(registry, addRuntime),
		proxies:       opts.TrustedProxies,
		webhookSecret: []byte(opts.WebhookSecret),
		readers:       []tokenDigest{digest(opts.APIToken), digest(opts.AdminToken)},
		admins:        []tokenDigest{digest(opts.AdminToken)},
		routes:        map[string]bool{},
		quietRoutes:   map[string]bool{},
		rescanMax:     opts.RescanBlocksMax,
	}
	for _, key := range opts.AlchemySigningKeys {
		s.alchemyKeys = append(s.alchemyKeys, []byte(key))
	}
	if err := s.providerOptions(opts, now); err != nil {
		return nil, err
	}
	refresh := opts.RegistryRefresh
	if refresh <= 0 {
		refresh = RegistryRefreshDefault
	}
	s.assets = &assetCache{load: opts.Store.Assets, now: now, refresh: refresh}
	s.rpcReports = &rpcReportCache{load: opts.Store.ReportedRPCs, now: now, refresh: refresh}
	s.networks = enabledNetworks(opts.Networks)
	s.redisUp = newRedisProbe(opts.Redis, registry)
	s.readyWithoutRedis = opts.ReadyWithoutRedis
	s.chain = opts.Chain
	s.rechecks = opts.Rechecks
	limitTimeout := opts.RateLimitTimeout
	if limitTimeout <= 0 {
		limitTimeout = RateLimitTimeoutDefault
	}
	if len(opts.RateLimit) > 0 {
		s.unverifiedLimit = &limiter{kind: limitUnverified, windows: opts.RateLimit, redis: opts.Redis, timeout: limitTimeout, now: now, log: opts.Log, metrics: s.metrics}
	}
	if len(opts.VerifiedRateLimit) > 0 {
		s.verifiedLimit = &limiter{kind: limitVerified, windows: opts.VerifiedRateLimit, redis: opts.Redis, timeout: limitTimeout, now: now, log: opts.Log, metrics: s.metrics}
	}
	s.providerBodyMax = opts.ProviderBodyMax
	if s.providerBodyMax <= 0 {
		s.providerBodyMax = ProviderBodyMaxDefault
	}
	bytesMax, clientBytesMax := opts.UnverifiedBytesMax, opts.UnverifiedClientBytesMax
	if bytesMax <= 0 {
		bytesMax = max(UnverifiedBytesMaxDefault, 2*s.providerBodyMax)
	}
	if clientBytesMax <= 0 {
		clientBytesMax = UnverifiedClientShareDefault(s.providerBodyMax, bytesMax)
	}
	s.unverified = newUnverifiedBytes(bytesMax, clientBytesMax, registry)
	// A timestamp passes the window from FutureSkewMax before it to
	// WEBHOOK_MAX_AGE after it: a claim made at the earliest must last
	// until the latest.
	s.quickNodeReplays = newReplayGuard(opts.Redis, limitTimeout, s.webhookMaxAge+quicknode.FutureSkewMax+time.Second, opts.Log, registry)

	e := s.echo
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	// Order matters: the trace id exists before anything logs, the
	// observer sees the final status, and a panic anywhere below is
	// recovered into that status.
	e.Pre(s.traceMiddleware, s.observeMiddleware, s.recoverMiddleware)
	e.Use(s.listenerMiddleware)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(registry, promhttp.HandlerOpts{})))
	e.GET("/openapi.yaml", serveSpec)
	for _, quiet := range []string{"/healthz", "/readyz", "/metrics"} {
		s.quietRoutes[quiet] = true
	}

	// Middleware is attached per route, not per group: echo gives a group
	// with middleware a catch-all that would turn a 405 into a 404.
	e.POST(routeWebhookPayments, s.webhookPayments, s.rateLimitMiddleware(HeaderSignature, HeaderAlchemySignature))
	// A provider route exists only with its secret: without one every
	// method is the 404 of an unknown path (a 405 would say it exists).
	if len(s.alchemyKeys) > 0 {
		e.POST(routeWebhookAlchemy, s.deliveries(providerAlchemy, s.webhookAlchemy), s.rateLimitMiddleware(HeaderAlchemySignature))
	}
	if len(s.quickNodeTokens) > 0 {
		e.POST(routeWebhookQuickNode, s.deliveries(providerQuickNode, s.webhookQuickNode), s.rateLimitMiddleware(HeaderQuickNodeSignature))
	}
	if len(s.moralisSecrets) > 0 {
		e.POST(routeWebhookMoralis, s.deliveries(providerMoralis, s.webhookMoralis), s.rateLimitMiddleware(HeaderMoralisSignature))
	}

	readAuth := s.requireToken(false, s.readers...)
	e.GET("/v1/users/:id/balances", s.userBalances, readAuth)
	e.GET("/v1/events/:event_id", s.event, readAuth)
	e.GET("/v1/holds/:hold_id", s.hold, readAuth)
	e.GET("/v1/events", s.eventsPage, readAuth)
	e.GET("/v1/users/:id/journal", s.journalPage, readAuth)

	adminAuth := s.requireToken(false, s.admins...)
	e.PUT("/admin/users/:id", s.adminPutUser, adminAuth)
	e.POST("/admin/deposit-addresses", s.adminAddDepositAddress, adminAuth)
	e.POST("/admin/networks", s.adminAddNetwork, adminAuth)
	e.POST("/admin/assets", s.adminAddAsset, adminAuth)
	e.POST("/admin/events/:event_id/recheck", s.adminRecheck, adminAuth)
	e.POST("/admin/rescan", s.adminRescan, adminAuth)
	e.GET("/admin/rescan/:id", s.adminRescanGet, adminAuth)
	e.POST("/admin/rescan/:id/cancel", s.adminRescanCancel, adminAuth)

	if err := s.addPlugins(opts.AdminRoutes, opts.AdminMounts); err != nil {
		return nil, err
	}
	for _, r := range s.Routes() {
		s.routes[r.Path] = true
	}
	return s, nil
}

// RouteInfo is a registered route: its method and echo path.
type RouteInfo struct {
	Method string
	Path   string
}

// Routes lists the registered routes.
func (s *Server) Routes() []RouteInfo {
	var out []RouteInfo
	for _, r := range s.echo.Routes() {
		if r.Method != echo.RouteNotFound {
			out = append(out, RouteInfo{Method: r.Method, Path: r.Path})
		}
	}
	return out
}

// addPlugins registers contributed admin routes after checking that the
// spec describes each one as a plug-in route.
func (s *Server) addPlugins(routes []Route, mounts []Mount) error {
	spec, err := loadSpec()
	if err != nil {
		return err
	}
	for _, r := range routes {
		if !strings.HasPrefix(r.Path, "/admin/") || r.Handler == nil {
			return fmt.Errorf("httpapi: admin route %s %s must be under /admin/ and have a handler", r.Method, r.Path)
		}
		if !spec.plugin(r.Method, r.Path) {
			return fmt.Errorf("httpapi: admin route %s %s is not described in openapi.yaml with x-settle-plugin: true", r.Method, r.Path)
		}
		s.echo.Add(r.Method, r.Path, wrapPlugin(r.Handler), s.requireToken(false, s.admins...))
	}
	for _, m := range mounts {
		if !strings.HasPrefix(m.Prefix, "/admin/") || !strings.HasSuffix(m.Prefix, "/") || m.Handler == nil {
			return fmt.Errorf("httpapi: mount %q must be under /admin/, end with / and have a handler", m.Prefix)
		}
		// The mount's bare name (/admin/console) is where a person types;
		// it sends them to the mount, which asks for credentials itself.
		bare := strings.TrimSuffix(m.Prefix, "/")
		s.echo.GET(bare, func(c echo.Context) error {
			target := m.Prefix
			if q := c.Request().URL.RawQuery; q != "" {
				target += "?" + q
			}
			return c.Redirect(http.StatusMovedPermanently, target)
		})
		path := m.Prefix + "*"
		for _, method := range mountMethods {
			if !spec.plugin(method, path) {
				return fmt.Errorf("httpapi: mount %s %s is not described in openapi.yaml with x-settle-plugin: true", method, path)
			}
			var auth []echo.MiddlewareFunc
			if !m.Authenticates {
				auth = append(auth, s.requireToken(true, s.admins...))
			}
			s.echo.Add(method, path, wrapPlugin(m.Handler), auth...)
		}
	}
	return nil
}

// wrapPlugin hands a contributed handler the path parameters (through
// PathParam) and a bounded body.
func wrapPlugin(h http.Handler) echo.HandlerFunc {
	return func(c echo.Context) error {
		names, values := c.ParamNames(), c.ParamValues()
		params := make(map[string]string, len(names))
		for i, name := range names {
			if i < len(values) {
				params[name] = unescapeParam(c, values[i])
			}
		}
		r := c.Request()
		r = r.WithContext(context.WithValue(r.Context(), pathParamsKey, params))
		r.Body = http.MaxBytesReader(c.Response(), r.Body, adminBodyMax)
		h.ServeHTTP(c.Response(), r)
		return nil
	}
}

// PathParam is a path parameter of a contributed route ("id" of
// "/admin/dlq/:id/replay").
func PathParam(r *http.Request, name string) string {
	params, _ := r.Context().Value(pathParamsKey).(map[string]string)
	return params[name]
}

// ServeHTTP makes the Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

// Serve answers on l until ctx ends, then stops taking connections and
// lets the requests in flight finish within shutdownTimeout. It returns
// nil after a clean stop.
func (s *Server) Serve(ctx context.Context, l net.Listener, shutdownTimeout time.Duration) error {
	return s.ServeSplit(ctx, l, nil, shutdownTimeout)
}

// storeContext bounds the storage work of a request.
func storeContext(c echo.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Request().Context(), storeTimeout)
}
