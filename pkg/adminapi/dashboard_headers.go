package adminapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
)

// inlineScript matches a script of the dashboard's page with no src: the
// page asynqmon renders has two (its flags and webpack's loader).
var inlineScript = regexp.MustCompile(`(?s)<script>(.*?)</script>`)

// dashboardPolicy is the dashboard's Content-Security-Policy: its own
// scripts and the page's inline ones by hash, nothing inline besides
// (MUI writes its styles inline, and the page links Google's fonts), its
// API on its own origin, and no page may frame it. The hashes are of the
// page as this handler renders it (its flags depend on the options), so
// the page is rendered once here; if it cannot be, no inline script runs
// and the dashboard stays blank rather than open.
func dashboardPolicy(handler http.Handler) string {
	r, _ := http.NewRequest(http.MethodGet, dashboardRoot+"/", nil)
	page := &pageRecorder{header: http.Header{}}
	handler.ServeHTTP(page, r)
	scripts := []string{"'self'"}
	if page.status == 0 || page.status == http.StatusOK {
		for _, m := range inlineScript.FindAllSubmatch(page.body.Bytes(), -1) {
			sum := sha256.Sum256(m[1])
			scripts = append(scripts, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		}
	}
	return strings.Join([]string{
		"default-src 'self'",
		"script-src " + strings.Join(scripts, " "),
		"style-src 'self' 'unsafe-inline' https://fonts.googleapis.com",
		"font-src 'self' https://fonts.gstatic.com",
		"img-src 'self' data:",
		"connect-src 'self'",
		"object-src 'none'",
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}, "; ")
}

// dashboardHeaders puts the console's security headers on every answer
// of the dashboard. Above all, no other site may frame it: in a frame,
// the dashboard's own buttons send same-origin requests that
// refuseCrossSite lets through, so a page could trick an operator's
// clicks into deleting or archiving tasks. Its answers (task payloads,
// queue state) are not kept by the browser; its hashed assets may be.
func dashboardHeaders(policy string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", policy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, dashboardRoot+"/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// pageRecorder keeps what a handler answers, to read the page it renders.
type pageRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (p *pageRecorder) Header() http.Header { return p.header }

func (p *pageRecorder) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}

func (p *pageRecorder) Write(b []byte) (int, error) { return p.body.Write(b) }
