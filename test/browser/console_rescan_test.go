package browser_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/console"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// A rescan typed far above the head waits for the chain forever: an
// operator logs in to the console in Chromium, opens the job's Cancel on
// the rescans page, gives a reason and cancels it; the job is failed, its
// error naming the operator and why, and the job beside it runs on.
func TestConsoleCancelsARescanInChromium(t *testing.T) {
	requireChromium(t)
	shots := newScreenshots(t)
	db, ts := consoleServer(t)

	ctx, cancel := context.WithTimeout(context.Background(), loginTimeout)
	defer cancel()
	_, err := db.CreateRescan(ctx, "rescan-typo", "ETH_MAINNET", 30_000_000, 30_000_100, "bob")
	require.NoError(t, err)
	_, err = db.CreateRescan(ctx, "rescan-meant", "ETH_MAINNET", 3_000_000, 3_000_100, "bob")
	require.NoError(t, err)
	// The branch changed under the other job once: its row says so.
	_, ok, err := db.ClaimRescan(ctx, "ETH_MAINNET", 3_000_000, "test", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = db.RestartRescan(ctx, "rescan-meant", "test", 3_000_000, 16, "the branch changed under the job")
	require.NoError(t, err)

	browser := startBrowser(ctx, t, ts.URL, operatorName, adminToken)
	form := `#cancel-rescan-typo`
	require.NoError(t, chromedp.Do(browser,
		chromedp.Navigate(ts.URL+"/admin/console/rescans"),
		chromedp.WaitVisible(chromedp.CSS(`#rescan-jobs`)),
		chromedp.Click(chromedp.CSS(`details:has(`+form+`) summary`)),
		chromedp.WaitVisible(chromedp.CSS(form+` textarea[name=reason]`)),
		chromedp.SendKeys(chromedp.CSS(form+` textarea[name=reason]`), "typo: block 3,000,000 meant"),
	))
	shots.take(browser, "10-rescan-cancel")
	require.NoError(t, chromedp.Do(browser, chromedp.Click(chromedp.CSS(form+` button[type=submit]`))))
	// A page without the notice is a refusal, however long it is waited
	// for; a minute covers a loaded machine's POST and render.
	noticeCtx, cancelNotice := context.WithTimeout(browser, time.Minute)
	defer cancelNotice()
	if err := chromedp.Do(noticeCtx, chromedp.WaitVisible(chromedp.CSS(`#notice`))); err != nil {
		require.NoError(t, err, "the cancel's notice; the page says: %s", pageText(t, browser, "body"))
	}
	require.Contains(t, pageText(t, browser, "#notice"), "Rescan cancelled")
	require.Contains(t, pageText(t, browser, "#rescan-jobs"), "cancelled by "+operatorName+" (console, admin)")
	shots.take(browser, "11-rescan-cancelled")

	job, err := db.Rescan(ctx, "rescan-typo")
	require.NoError(t, err)
	require.Equal(t, "failed", job.Status)
	require.Regexp(t, `^cancelled by `+operatorName+` \(console, admin\) @127\.0\.0\.1: typo: block 3,000,000 meant$`, job.Error)
	other, err := db.Rescan(ctx, "rescan-meant")
	require.NoError(t, err)
	require.Equal(t, "running", other.Status, "only the job cancelled")
	require.Contains(t, pageText(t, browser, "#restarts-rescan-meant"), "restarted 1×, last ")
	require.Contains(t, pageText(t, browser, "#restarts-rescan-meant"), "the branch changed under the job; reading again from block 3000000")
	cancelForms, err := chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll("#cancel-rescan-typo").length`))
	require.NoError(t, err)
	require.Zero(t, cancelForms, "an ended job offers no Cancel")
	cancelForms, err = chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll("#cancel-rescan-meant").length`))
	require.NoError(t, err)
	require.Equal(t, 1, cancelForms, "the running one still does")
}

// consoleServer is an api on real PostgreSQL and Redis with the console
// mounted on its admin listener, as cmd/api builds it.
func consoleServer(t *testing.T) (*postgres.DB, *httptest.Server) {
	t.Helper()
	db := testenv.OpenDB(t, testenv.DatabaseURL(t))
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	operatorConsole, err := console.New(console.Options{Store: db, AdminToken: adminToken})
	require.NoError(t, err)
	server, err := httpapi.New(httpapi.Options{
		Store:         db,
		Redis:         rdb,
		Log:           zerolog.Nop(),
		WebhookSecret: "webhook-secret-0123456789-abcdefghij",
		APIToken:      "api-token-0123456789-abcdefghijklmnop",
		AdminToken:    adminToken,
		AdminMounts:   []httpapi.Mount{operatorConsole.Mount()},
	})
	require.NoError(t, err)
	ts := httptest.NewServer(server)
	t.Cleanup(ts.Close)
	return db, ts
}
