package browser_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

const (
	// consoleTimeout bounds the whole browser session; a safety net.
	consoleTimeout = 4 * time.Minute
	// settleTimeout bounds waiting for the replayed event to settle.
	settleTimeout = 2 * time.Minute
	consoleEvent  = "console-deposit-1"
	operatorName  = "alice"
)

// requireChromium skips without Chromium, except in CI, where it must be
// there (.ci/run installs Debian's chromium).
func requireChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI (.ci/run installs Debian's chromium): %v", chromiumPath, err)
		}
		t.Skipf("%s not installed", chromiumPath)
	}
}

// screenshots keeps the test's screenshots: in $SETTLE_ARTIFACTS if set,
// else in the test's artifact directory (under -outputdir with
// `go test -artifacts`).
type screenshots struct {
	t   *testing.T
	dir string
}

func newScreenshots(t *testing.T) *screenshots {
	dir := os.Getenv("SETTLE_ARTIFACTS")
	if dir != "" {
		dir = filepath.Join(dir, "console")
		require.NoError(t, os.MkdirAll(dir, 0o755))
	} else {
		dir = t.ArtifactDir()
	}
	return &screenshots{t: t, dir: dir}
}

func (s *screenshots) take(ctx context.Context, name string) {
	s.t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	require.NoError(s.t, err)
	path := filepath.Join(s.dir, name+".png")
	require.NoError(s.t, os.WriteFile(path, png, 0o644))
	s.t.Logf("screenshot: %s", path)
}

// The real system (api, scheduler, worker on PostgreSQL and Redis) and a
// real browser: a deposit dead-letters while the scheduler cannot reach
// Redis; an operator logs in to the console (the browser answers the
// Basic challenge), finds the event by its id, opens its story, replays
// its dead letter with a reason, and watches the event settle.
func TestConsoleReplaysADeadLetterInChromium(t *testing.T) {
	requireChromium(t)
	shots := newScreenshots(t)
	s := harness.NewStack(t)
	s.Env["STALE_ENQUEUED_AFTER"] = "1s"
	s.Env["RECOVER_INTERVAL"] = "1s"
	s.Env["MAX_RECOVERY_ATTEMPTS"] = "2"
	s.Env["POLL_INTERVAL"] = "200ms"
	api := s.StartAPI(map[string]string{"TRACE_UI_URL": "http://traces.invalid/trace/{trace_id}"})
	client := harness.NewClient(api.URL())
	status, _, err := client.Admin(http.MethodPut, "/admin/users/1", nil)
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusCreated, http.StatusOK}, status)
	status, _, err = client.Webhook(harness.Payment(consoleEvent, "deposit", 1, "ETH", "2.5"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)

	// A scheduler whose Redis is a port nothing listens on: the event is
	// claimed, never queued, recovered twice, then dead-lettered.
	stranded := s.Spawn("scheduler", map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"})
	s.WaitFor("the deposit dead-lettered", time.Minute, func() bool {
		return s.Count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = $1 AND resolution IS NULL`, consoleEvent) == 1
	})
	stranded.Stop(15 * time.Second)
	// Redis is back for everyone: a scheduler and a worker that work.
	healthy := map[string]string{"STALE_ENQUEUED_AFTER": "3m", "RECOVER_INTERVAL": "2m"}
	s.StartScheduler(healthy)
	s.StartWorker(healthy)

	ctx, cancel := context.WithTimeout(context.Background(), consoleTimeout)
	defer cancel()
	browser := startBrowser(ctx, t, api.URL(), operatorName, harness.AdminToken)
	console := api.URL() + "/admin/console/"

	// Log in: the overview, with the dead letter among the open ones.
	require.NoError(t, chromedp.Do(browser,
		chromedp.Navigate(console),
		chromedp.WaitVisible(chromedp.CSS(`#live`)),
		chromedp.WaitVisible(fmt.Sprintf(`//a[normalize-space(text())=%q]`, consoleEvent)),
	))
	dlqOpen := pageText(t, browser, "#dlq-open")
	require.Equal(t, "1", strings.TrimSpace(dlqOpen))
	shots.take(browser, "01-overview")

	// Find the event by its id: the search leads to its story.
	require.NoError(t, chromedp.Do(browser,
		chromedp.SendKeys(chromedp.CSS(`#search`), consoleEvent),
		chromedp.Submit(chromedp.CSS(`#search`)),
		chromedp.WaitVisible(chromedp.CSS(`#event-id`)),
	))
	eventID := pageText(t, browser, "#event-id")
	require.Equal(t, consoleEvent, eventID)
	statusBefore, err := chromedp.Run(browser, chromedp.AttributeValue(chromedp.CSS(`#event-status`), "data-status"))
	require.NoError(t, err)
	require.Equal(t, "failed", statusBefore.Value)
	shots.take(browser, "02-story-dead-lettered")

	// Its dead letter, replayed with a reason.
	require.NoError(t, chromedp.Do(browser,
		chromedp.Click(`//section//table//a[starts-with(text(), "#")]`),
		chromedp.WaitVisible(chromedp.CSS(`#replay-form`)),
		chromedp.SendKeys(chromedp.CSS(`#replay-form textarea[name=reason]`), "Redis is reachable again"),
	))
	shots.take(browser, "03-dead-letter")
	require.NoError(t, chromedp.Do(browser,
		chromedp.Click(chromedp.CSS(`#replay-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#notice`)),
	))
	require.Contains(t, pageText(t, browser, "#notice"), "Replayed")

	// Back to the story: it refreshes itself until the event settles.
	require.NoError(t, chromedp.Do(browser,
		chromedp.Click(chromedp.CSS(`#entry-event`)),
		chromedp.WaitVisible(chromedp.CSS(`#event-status`)),
	))
	settleCtx, cancelSettle := context.WithTimeout(browser, settleTimeout)
	defer cancelSettle()
	require.NoError(t, chromedp.Do(settleCtx, chromedp.WaitVisible(chromedp.CSS(`#event-status[data-status="confirmed"]`))),
		"the story showed the event confirmed")
	// htmx swapped in the settled status; the page is loaded again for
	// the rest of the story (the journal row, the replay's record).
	require.NoError(t, chromedp.Do(browser, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#timeline`))))
	story := pageText(t, browser, "main")
	require.Contains(t, story, "replayed by "+operatorName+" (console, admin)")
	require.Contains(t, story, "Redis is reachable again")
	require.Contains(t, story, "journal: deposit 2.5 ETH")
	traceLink, err := chromedp.Run(browser, chromedp.AttributeValue(chromedp.CSS(`#trace-id a`), "href"))
	require.NoError(t, err)
	var traceID string
	require.NoError(t, s.DB.QueryRow(ctx, `SELECT trace_id FROM payment_events WHERE event_id = $1`, consoleEvent).Scan(&traceID))
	require.NotEmpty(t, traceID)
	// A UUID trace_id links out by its hex digits, the tracing UI's id.
	require.Equal(t, "http://traces.invalid/trace/"+strings.ReplaceAll(traceID, "-", ""), traceLink.Value, "the trace id links out to TRACE_UI_URL")
	shots.take(browser, "04-story-confirmed")

	require.Equal(t, 1, s.Count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND status = 'confirmed'`, consoleEvent))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM balance_events WHERE source_event_id = $1`, consoleEvent))
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = $1 AND resolution = 'replayed'
		AND resolved_by LIKE $2 AND resolution_reason = 'Redis is reachable again'`, consoleEvent, operatorName+" (console, admin) @%"))
}

// startBrowser runs headless Chromium whose requests to base go on and
// whose 401s are answered with Basic credentials (the browser's own
// login, as an operator's); requests elsewhere fail at once.
func startBrowser(ctx context.Context, t *testing.T, base, user, password string) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)

	var mu sync.Mutex
	var failures []error
	var challenged int
	answered := func(err error) {
		if err != nil && browser.Err() == nil {
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
		}
	}
	paused := chromedp.Events(browser, fetch.RequestPaused)
	authRequired := chromedp.Events(browser, fetch.AuthRequired)
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			if strings.HasPrefix(ev.Request.URL, base+"/") {
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
			challenged++
			mu.Unlock()
			require.Equal(t, "basic", strings.ToLower(ev.AuthChallenge.Scheme), "the browser answers Basic")
			_, err = chromedp.Call(browser, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{
				RequestID: ev.RequestID,
				AuthChallengeResponse: &fetch.AuthChallengeResponse{
					Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: user, Password: password,
				},
			})
			answered(err)
		}
	}()
	handleAuth := true
	_, err := chromedp.Call(browser, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth})
	require.NoError(t, err)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, failures)
		require.NotZero(t, challenged, "the console challenged the browser")
	})
	return browser
}

// pageText is the visible text (innerText, as chromedp.Text reads it)
// of the first element matching selector, read in
// the page's JavaScript rather than through a DOM node id: a node found a
// moment earlier may be gone from chromedp's view once the document is
// updated ("No node with given id found"), though the element is still
// on the page. A failed read (a navigation ending the poll) is tried again.
func pageText(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	expr := fmt.Sprintf(`document.querySelector(%q)?.innerText`, selector)
	var err error
	for range pageTextTries {
		var text string
		if text, err = chromedp.Run(ctx, chromedp.Poll[string](expr, chromedp.WithPollingTimeout(pageTextTimeout))); err == nil {
			return text
		}
	}
	require.NoError(t, err, "the text of %s", selector)
	return ""
}

const (
	pageTextTries   = 3
	pageTextTimeout = 10 * time.Second
)
