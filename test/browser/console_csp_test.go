package browser_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// Every console page runs under its Content-Security-Policy with nothing
// refused: htmx, once started on the page, injects no style of its own
// (the policy allows none), and the browser logs no violation.
func TestConsolePagesRunUnderTheirPolicyInChromium(t *testing.T) {
	requireChromium(t)
	_, ts := consoleServer(t)

	ctx, cancel := context.WithTimeout(context.Background(), loginTimeout)
	defer cancel()
	browser := startBrowser(ctx, t, ts.URL, operatorName, adminToken)
	// Both ways a refusal shows: the page's securitypolicyviolation event
	// and the browser's log (what an operator sees in the console).
	_, err := chromedp.Call(browser, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: recordViolations +
		`
document.addEventListener("htmx:after:swap", () => { window.liveSwapped = true; });`})
	require.NoError(t, err)
	var mu sync.Mutex
	var logged []string
	entries := chromedp.Events(browser, cdplog.EntryAdded)
	go func() {
		for ev, err := range entries {
			if err != nil {
				return
			}
			if ev.Entry.Level == cdplog.EntryLevelError {
				mu.Lock()
				logged = append(logged, ev.Entry.Text)
				mu.Unlock()
			}
		}
	}()
	_, err = chromedp.Call(browser, cdplog.Enable, cdp.Empty{})
	require.NoError(t, err)

	for _, path := range []string{"", "events", "dlq", "holds", "rescans"} {
		require.NoError(t, chromedp.Do(browser,
			chromedp.Navigate(ts.URL+"/admin/console/"+path),
			chromedp.WaitVisible(chromedp.CSS(`main`)),
		), path)
		// htmx started on the page (it sets up, and would inject its
		// indicator style, once the document is loaded).
		started, err := chromedp.Run(browser, chromedp.Poll[bool](`document.readyState === "complete" && !!window.htmx && !!window.htmx.version`))
		require.NoError(t, err, path)
		require.True(t, started, path)
		if path == "" {
			// The overview's live part (every 5s): htmx's request and swap.
			// Given a minute: a blocked swap never comes, a slow machine's
			// first one may come well after 15 s.
			swapped, err := chromedp.Run(browser, chromedp.Poll[bool](`window.liveSwapped`, chromedp.WithPollingTimeout(time.Minute)))
			require.NoError(t, err, "the overview's live part was swapped")
			require.True(t, swapped)
		}
		violations, err := chromedp.Run(browser, chromedp.Evaluate[[]string](`window.cspViolations`))
		require.NoError(t, err)
		require.Empty(t, violations, "/admin/console/%s runs under its Content-Security-Policy", path)
	}
	mu.Lock()
	defer mu.Unlock()
	var refused []string
	for _, text := range logged {
		if strings.Contains(text, "Content Security Policy") {
			refused = append(refused, text)
		}
	}
	require.Empty(t, refused, "the browser logged no refusal")
}
