// Package browser logs in to the dashboard with a real browser: headless
// Chromium answering the 401's Basic challenge, as an operator's browser
// does.
package browser_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
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
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()

	// Every request pauses in the fetch domain until answered: requests to
	// the server under test go on, others (the page's web fonts) fail at
	// once, and the 401's challenge is answered with the admin token.
	paused := chromedp.Events(browser, fetch.RequestPaused)
	authRequired := chromedp.Events(browser, fetch.AuthRequired)
	var mu sync.Mutex
	var challenges []fetch.AuthChallenge
	var answerErrs []error
	answered := func(err error) {
		if err != nil && browser.Err() == nil {
			mu.Lock()
			answerErrs = append(answerErrs, err)
			mu.Unlock()
		}
	}
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			if strings.HasPrefix(ev.Request.URL, ts.URL+"/") {
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
			mu.Lock()
			challenges = append(challenges, *ev.AuthChallenge)
			mu.Unlock()
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
	_, err = chromedp.Call(browser, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth})
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
	mu.Lock()
	require.Empty(t, answerErrs)
	require.NotEmpty(t, challenges, "Chromium was challenged")
	for _, c := range challenges {
		require.Equal(t, "basic", strings.ToLower(c.Scheme), "Chromium answers the Basic challenge, not Bearer")
		require.Equal(t, "settle", c.Realm)
		require.Equal(t, fetch.AuthChallengeSourceServer, c.Source)
	}
	mu.Unlock()

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
