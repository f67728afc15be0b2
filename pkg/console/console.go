// Package console is the operator console at /admin/console/ on the admin
// listener: server-rendered pages (html/template, embedded) that show
// settle's own state — the PostgreSQL backlog, events and their whole
// story, dead letters, holds, scanners and rescans — and act on it through
// the same recorded, idempotent operations as the admin API (DLQ replay
// and discard, deposit recheck, rescan and its cancel).
//
// The console authenticates itself: the admin token may look and act, the
// read-only token (ADMIN_READONLY_TOKEN) may only look. Browsers log in
// with HTTP Basic (any user name, the token as password); the user name
// names the operator in what the console records. Every action is a POST
// form carrying a CSRF token bound to the credential, checked with the
// request's Origin, and a required reason.
//
// The only script is htmx (static/htmx.min.js, vendored and pinned; see
// static/README.md), used to refresh live panels; every page works
// without it.
package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// Prefix is where the console is mounted.
const Prefix = "/admin/console/"

// Bounds of the console.
const (
	// requestTimeout bounds the storage work of one page or action.
	requestTimeout = 10 * time.Second
	// recheckTimeout bounds a recheck (a few RPC calls), as the API's.
	recheckTimeout = 20 * time.Second
	// reasonMax and operatorMax bound what an action records.
	reasonMax   = payment.ReasonLengthMax
	operatorMax = payment.OperatorLengthMax
	// bulkMax bounds one bulk replay.
	bulkMax = 100
	// listMax bounds a page of events, dead letters or holds.
	listMax = 100
	// overviewRows is how many open dead letters and recent events the
	// overview shows.
	overviewRows = 10
	// formBodyMax bounds a form's body.
	formBodyMax = 64 << 10
	// searchMax bounds the search text.
	searchMax = 300
)

// Store is what the console reads and does; *postgres.DB implements it.
type Store interface {
	Backlog(ctx context.Context, timeout time.Duration) (postgres.Backlog, error)
	OpenDeadLetters(ctx context.Context) (int64, time.Duration, error)
	ScanCursors(ctx context.Context) ([]postgres.ScanCursor, bool, error)
	RecentEvents(ctx context.Context, limit int) ([]postgres.EventView, error)
	UserEvents(ctx context.Context, user int64, limit int) ([]postgres.EventView, error)
	EventsOfTx(ctx context.Context, txHash string) (postgres.TxEvents, error)
	EventStory(ctx context.Context, eventID string) (postgres.Story, error)
	Event(ctx context.Context, id string) (postgres.EventView, error)
	DeadLetters(ctx context.Context, state string, afterID int64, limit int) ([]postgres.DeadLetterView, error)
	DeadLetter(ctx context.Context, id int64) (postgres.DeadLetterView, error)
	ReplayDeadLetter(ctx context.Context, id int64, who, why string) (postgres.ReplayResult, error)
	DiscardDeadLetter(ctx context.Context, id int64, who, why string) (bool, error)
	Holds(ctx context.Context, f postgres.HoldFilter) ([]postgres.Hold, error)
	Hold(ctx context.Context, holdID string) (postgres.Hold, error)
	RescanJobs(ctx context.Context, limit int) ([]postgres.RescanJob, bool, error)
	CancelRescan(ctx context.Context, id, who, why string) error
	Networks(ctx context.Context) ([]string, error)
}

var _ Store = (*postgres.DB)(nil)

// Chain asks the chain again about a failed deposit: the admin API's
// recheck (*finality.Rechecker). Nil when the api has no RPC.
type Chain interface {
	Recheck(ctx context.Context, eventID, who string) (postgres.Recheck, error)
}

// Rescans starts a rescan job (POST /admin/rescan's operation). Nil: the
// console lists jobs but cannot start one.
type Rescans interface {
	StartRescan(ctx context.Context, network string, from, to uint64, operator string) (id string, err error)
}

// Breaker is one circuit breaker's shared state ("closed", "open",
// "half_open").
type Breaker struct {
	Name  string
	State string
}

// Breakers reads the chain breakers' shared state. Nil: not shown.
type Breakers interface {
	BreakerStates(ctx context.Context) ([]Breaker, error)
}

// Options configure a Console.
type Options struct {
	Store Store
	// AdminToken may look and act; ReadOnlyToken ("" for none) may only
	// look. Both at least httpapi.SecretLengthMin characters.
	AdminToken    string
	ReadOnlyToken string
	Chain         Chain
	Rescans       Rescans
	Breakers      Breakers
	// TraceURL links a trace id out to a tracing UI: an http(s) URL with
	// a {trace_id} placeholder (TRACE_UI_URL). Empty: no link.
	TraceURL string
	// Now is the clock (tests fix it); nil: time.Now.
	Now func() time.Time
}

// Console serves the console's pages.
type Console struct {
	o       Options
	now     func() time.Time
	admin   tokenDigest
	viewer  *tokenDigest
	csrfKey []byte
	pages   map[string]*template.Template
	static  http.Handler
	mux     *http.ServeMux
}

// TracePlaceholder is what TraceURL's trace id replaces.
const TracePlaceholder = "{trace_id}"

// New checks the options and parses the pages.
func New(o Options) (*Console, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("console: Store is required")
	case len(o.AdminToken) < httpapi.SecretLengthMin:
		return nil, fmt.Errorf("console: the admin token must be at least %d characters", httpapi.SecretLengthMin)
	case o.ReadOnlyToken != "" && len(o.ReadOnlyToken) < httpapi.SecretLengthMin:
		return nil, fmt.Errorf("console: the read-only token must be at least %d characters", httpapi.SecretLengthMin)
	case o.ReadOnlyToken != "" && o.ReadOnlyToken == o.AdminToken:
		return nil, errors.New("console: the read-only token must differ from the admin token")
	case o.TraceURL != "" && !validTraceURL(o.TraceURL):
		return nil, fmt.Errorf("console: the trace URL must be http(s) and contain %s", TracePlaceholder)
	}
	c := &Console{o: o, now: o.Now, admin: digest(o.AdminToken), csrfKey: csrfKey(o.AdminToken)}
	if c.now == nil {
		c.now = time.Now
	}
	if o.ReadOnlyToken != "" {
		d := digest(o.ReadOnlyToken)
		c.viewer = &d
	}
	var err error
	if c.pages, err = parsePages(c.funcs()); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(static))
	c.routes()
	return c, nil
}

// validTraceURL accepts an http(s) URL with the placeholder.
func validTraceURL(v string) bool {
	return (strings.HasPrefix(v, "http://") || strings.HasPrefix(v, "https://")) && strings.Contains(v, TracePlaceholder)
}

// Mount is the console as an httpapi mount: httpapi keeps it off the
// public listener, the console checks credentials itself.
func (c *Console) Mount() httpapi.Mount {
	return httpapi.Mount{Prefix: Prefix, Handler: c, Authenticates: true}
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET "+Prefix+"{$}", c.overview)
	m.HandleFunc("GET "+Prefix+"live", c.overviewLive)
	m.HandleFunc("GET "+Prefix+"events", c.events)
	m.HandleFunc("GET "+Prefix+"event", c.event)
	m.HandleFunc("GET "+Prefix+"event/status", c.eventStatus)
	m.HandleFunc("POST "+Prefix+"event/recheck", c.action(c.recheck))
	m.HandleFunc("GET "+Prefix+"dlq", c.deadLetters)
	m.HandleFunc("GET "+Prefix+"dlq/{id}", c.deadLetter)
	m.HandleFunc("POST "+Prefix+"dlq/{id}/replay", c.action(c.replay))
	m.HandleFunc("POST "+Prefix+"dlq/{id}/discard", c.action(c.discard))
	m.HandleFunc("POST "+Prefix+"dlq/bulk-replay", c.action(c.bulkReplay))
	m.HandleFunc("GET "+Prefix+"holds", c.holds)
	m.HandleFunc("GET "+Prefix+"hold", c.hold)
	m.HandleFunc("GET "+Prefix+"rescans", c.rescans)
	m.HandleFunc("POST "+Prefix+"rescans", c.action(c.startRescan))
	m.HandleFunc("POST "+Prefix+"rescans/{id}/cancel", c.action(c.cancelRescan))
	m.Handle("GET "+Prefix+"static/", c.static)
	m.HandleFunc(Prefix, c.noPage)
	c.mux = m
}

// noPage answers a path or method no page serves in the API's error
// shape, not the mux's plain text: 405 with Allow where the path takes
// another method, else 404.
func (c *Console) noPage(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = method
		if _, pattern := c.mux.Handler(probe); pattern != Prefix {
			allow = append(allow, method)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		httpapi.WriteError(w, r, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	httpapi.WriteError(w, r, http.StatusNotFound, "not found")
}

// ServeHTTP authenticates, sets the security headers and routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No inline script or style anywhere: the pages need nothing but
	// their own origin.
	h.Set("Content-Security-Policy", "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	id, ok := c.authenticate(r)
	if !ok {
		challenge(h)
		httpapi.WriteError(w, r, http.StatusUnauthorized, "missing or invalid token")
		return
	}
	if !strings.HasPrefix(r.URL.Path, Prefix+"static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
}

// storeContext bounds the storage work of a request.
func storeContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), requestTimeout)
}
