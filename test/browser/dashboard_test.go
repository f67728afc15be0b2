// Package browser logs in to the dashboard with a real browser: headless
// Chromium answering the 401's Basic challenge, as an operator's browser
// does.
package browser_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	chromiumPath = "/usr/bin/chromium"
	adminToken   = "admin-token-0123456789-abcdefghijklmn"
	// loginTimeout bounds the whole browser session; a safety net, not a
	// timing assertion.
	loginTimeout = 2 * time.Minute
)

// seen is what the server saw: each request's path, the scheme of its
// Authorization header and its status.
type seen struct {
	mu       sync.Mutex
	requests []request
}

type request struct {
	path, scheme string
	status       int
}

func (s *seen) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		s.mu.Lock()
		s.requests = append(s.requests, request{path: r.URL.Path, scheme: scheme, status: rec.status})
		s.mu.Unlock()
	})
}

func (s *seen) all() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.requests...)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// artifactDir is where the screenshot goes: $SETTLE_ARTIFACTS if set.
func artifactDir(t *testing.T) string {
	if dir := os.Getenv("SETTLE_ARTIFACTS"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	return t.TempDir()
}

// Chromium opens /admin/queues/, gets the 401, answers its Basic
// challenge with the admin token (the browser's own auth handling, not a
// header set in advance), and the asynqmon dashboard loads and talks to
// its API with the same credentials.
func TestChromiumLogsInToTheDashboard(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI (.ci/run installs Debian's chromium): %v", chromiumPath, err)
		}
		t.Skipf("%s not installed", chromiumPath)
	}
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store:         testenv.OpenDB(t, testenv.DatabaseURL(t)),
		Redis:         rdb,
		Log:           zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789-abcdefghij",
		APIToken:      "api-token-0123456789-abcdefghijklmnop",
		AdminToken:    adminToken,
		AdminMounts:   []httpapi.Mount{adminapi.Dashboard(rdb, true)},
	})
	require.NoError(t, err)
	var requests seen
	ts := httptest.NewServer(requests.wrap(server))
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithTimeout(context.Background(), loginTimeout)
	defer cancel()
	b := newDashboardBrowser(ctx, t, func(url string) bool { return strings.HasPrefix(url, ts.URL+"/") })
	browser := b.ctx
	// The page reports what its Content-Security-Policy refused.
	_, err = chromedp.Call(browser, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: recordViolations})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(browser,
		chromedp.Navigate(ts.URL+"/admin/queues/"),
		chromedp.WaitVisible(chromedp.CSS("#root")),
		// The app rendered its navigation (a React app: the served HTML
		// has an empty #root).
		chromedp.WaitVisible(`//*[@id="root"]//*[contains(text(), "Queues")]`),
	), "requests the server saw: %+v", requests.all())
	title, err := chromedp.Run(browser, chromedp.Title())
	require.NoError(t, err)
	screenshot, err := chromedp.Run(browser, chromedp.FullScreenshot(100)) // quality 100: PNG
	require.NoError(t, err)

	path := filepath.Join(artifactDir(t), "dashboard-login.png")
	require.NoError(t, os.WriteFile(path, screenshot, 0o644))
	t.Logf("screenshot: %s", path)

	require.Equal(t, "Asynq - Monitoring", title)
	violations, err := chromedp.Run(browser, chromedp.Evaluate[[]string](`window.cspViolations`))
	require.NoError(t, err)
	require.Empty(t, violations, "the dashboard runs under its Content-Security-Policy")
	challenges, answerErrs := b.results()
	require.Empty(t, answerErrs)
	require.NotEmpty(t, challenges, "Chromium was challenged")
	for _, c := range challenges {
		require.Equal(t, "basic", strings.ToLower(c.Scheme), "Chromium answers the Basic challenge, not Bearer")
		require.Equal(t, "settle", c.Realm)
		require.Equal(t, fetch.AuthChallengeSourceServer, c.Source)
	}

	// The first visit had no credentials and got the 401; the browser
	// then sent Basic, and the dashboard's own API calls went through.
	all := requests.all()
	require.NotEmpty(t, all)
	require.Equal(t, request{path: "/admin/queues/", scheme: "", status: http.StatusUnauthorized}, all[0])
	var page, api bool
	for _, r := range all[1:] {
		page = page || (r.path == "/admin/queues/" && r.scheme == "Basic" && r.status == http.StatusOK)
		api = api || (strings.HasPrefix(r.path, "/admin/queues/api/") && r.scheme == "Basic" && r.status == http.StatusOK)
	}
	require.True(t, page, "the page loaded with Basic credentials: %+v", all)
	require.True(t, api, "the dashboard's API answered with Basic credentials: %+v", all)
}

// recordViolations, run in every document before its own scripts, keeps
// what the page's Content-Security-Policy refused in window.cspViolations.
const recordViolations = `window.cspViolations = [];
document.addEventListener("securitypolicyviolation", e => window.cspViolations.push(e.violatedDirective + " " + e.blockedURI));`

// dashboardBrowser is headless Chromium whose requests that allow passes
// go on (others fail at once) and whose 401s are answered with Basic and
// the admin token, as an operator's browser does.
type dashboardBrowser struct {
	ctx        context.Context
	mu         sync.Mutex
	challenges []fetch.AuthChallenge
	errs       []error
}

func newDashboardBrowser(ctx context.Context, t *testing.T, allow func(url string) bool) *dashboardBrowser {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)
	b := &dashboardBrowser{ctx: browser}

	// Every request pauses in the fetch domain until answered: requests
	// allow passes go on, others (the page's web fonts) fail at once, and
	// a 401's challenge is answered with the admin token.
	paused := chromedp.Events(browser, fetch.RequestPaused)
	authRequired := chromedp.Events(browser, fetch.AuthRequired)
	answered := func(err error) {
		if err != nil && browser.Err() == nil {
			b.mu.Lock()
			b.errs = append(b.errs, err)
			b.mu.Unlock()
		}
	}
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			if allow(ev.Request.URL) {
				_, err = chromedp.Call(browser, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
			} else {
				_, err = chromedp.Call(browser, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonBlockedByClient})
			}
			answered(err)
		}
	}()
	go func() {
		for ev, err := range authRequired {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.challenges = append(b.challenges, *ev.AuthChallenge)
			b.mu.Unlock()
			_, err = chromedp.Call(browser, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{
				RequestID: ev.RequestID,
				AuthChallengeResponse: &fetch.AuthChallengeResponse{
					Response: fetch.AuthChallengeResponseResponseProvideCredentials,
					Username: "ops",
					Password: adminToken,
				},
			})
			answered(err)
		}
	}()
	handleAuth := true
	_, err := chromedp.Call(browser, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth})
	require.NoError(t, err)
	return b
}

// results are the challenges the browser answered and the errors of
// answering its requests.
func (b *dashboardBrowser) results() ([]fetch.AuthChallenge, []error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]fetch.AuthChallenge(nil), b.challenges...), append([]error(nil), b.errs...)
}

// TestChromiumWillNotFrameTheDashboard: an operator logged in to the
// dashboard (writable) opens another origin's page that frames it.
// Framed, the dashboard's buttons would send same-origin requests, which
// the cross-site check lets through, so a page laid over it could turn
// the operator's clicks into deleting tasks; Chromium must refuse to show
// it.
func TestChromiumWillNotFrameTheDashboard(t *testing.T) {
	requireChromium(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	server, err := httpapi.New(httpapi.Options{
		Store:         testenv.OpenDB(t, testenv.DatabaseURL(t)),
		Redis:         rdb,
		Log:           zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789-abcdefghij",
		APIToken:      "api-token-0123456789-abcdefghijklmnop",
		AdminToken:    adminToken,
		AdminMounts:   []httpapi.Mount{adminapi.DashboardWith(rdb, adminapi.DashboardOptions{ReadOnly: false})},
	})
	require.NoError(t, err)
	var requests seen
	ts := httptest.NewServer(requests.wrap(server))
	t.Cleanup(ts.Close)
	dashboard := ts.URL + "/admin/queues/"
	// Another origin of the same site (127.0.0.1, another port), as another
	// tool's page under the operator's domain is: a browser partitions
	// its credentials by site, so there it sends the dashboard's.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, `<!doctype html><title>a prize</title><iframe id="framed" src="%s" width="1200" height="800"></iframe>`, dashboard)
	}))
	t.Cleanup(other.Close)
	otherURL := other.URL

	ctx, cancel := context.WithTimeout(context.Background(), loginTimeout)
	defer cancel()
	b := newDashboardBrowser(ctx, t, func(url string) bool {
		return strings.HasPrefix(url, ts.URL+"/") || strings.HasPrefix(url, otherURL+"/")
	})
	require.NoError(t, chromedp.Do(b.ctx,
		chromedp.Navigate(dashboard),
		chromedp.WaitVisible(`//*[@id="root"]//*[contains(text(), "Queues")]`),
	), "the operator logged in: %+v", requests.all())

	loggedIn := len(requests.all())
	require.NoError(t, chromedp.Do(b.ctx, chromedp.Navigate(otherURL+"/"), chromedp.WaitReady("#framed")))
	// The frame's document was asked for and answered with the
	// operator's credentials: what the browser does with it is the test.
	require.Eventually(t, func() bool {
		for _, r := range requests.all()[loggedIn:] {
			if r.path == "/admin/queues/" && r.scheme == "Basic" && r.status == http.StatusOK {
				return true
			}
		}
		return false
	}, loginTimeout/2, 50*time.Millisecond, "the frame asked for the dashboard: %+v", requests.all()[loggedIn:])

	var framed *cdp.Frame
	require.Eventually(t, func() bool {
		tree, err := chromedp.Call(b.ctx, page.GetFrameTree, cdp.Empty{})
		if err != nil || len(tree.FrameTree.ChildFrames) != 1 {
			return false
		}
		framed = tree.FrameTree.ChildFrames[0].Frame
		return framed.URL != "" && framed.URL != "about:blank"
	}, loginTimeout/2, 50*time.Millisecond, "the frame settled")
	t.Logf("framed: url %q, unreachable %q", framed.URL, framed.UnreachableURL)
	require.NotEqual(t, dashboard, framed.URL, "Chromium showed the dashboard in another origin's frame")
}
