package console

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/tracing"
)

//go:embed templates/*.html static/*
var assets embed.FS

// pageNames are the full pages; each is base.html around its content.
// Fragments are templates the pages define and htmx fetches alone.
var pageNames = []string{"overview", "events", "event", "dlq", "dlq_entry", "bulk_confirm", "bulk_done", "holds", "hold", "rescans", "error"}

func parsePages(funcs template.FuncMap) (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/base.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// view is what every page gets: who is looking, whether they may act,
// the CSRF token of its forms, and the page's own data.
type view struct {
	Title  string
	Nav    string
	User   string
	Role   Role
	CanAct bool
	CSRF   string
	Notice string
	Data   any
}

func (c *Console) view(r *http.Request, nav, title string, data any) view {
	id := identityOf(r)
	return view{Title: title, Nav: nav, User: id.user, Role: id.role, CanAct: id.role == RoleAdmin,
		CSRF: c.csrfToken(id, c.now()), Notice: notices[r.URL.Query().Get("done")], Data: data}
}

// notices are what a redirect after an action may say (?done=...): fixed
// texts, so a link cannot put words in the console's mouth.
var notices = map[string]string{
	"replay:reopened":         "Replayed: the event is back in the outbox and will be processed again.",
	"replay:already_replayed": "This entry was already replayed; nothing changed.",
	"replay:superseded":       "The entry no longer applied (its event settled, or its failure was replayed already); the entry is closed, nothing else changed.",
	"discard:discarded":       "Discarded: the entry is closed for good.",
	"discard:already":         "This entry was already discarded; nothing changed.",
	"recheck:reopened":        "Recheck: the chain shows the transfer final; the deposit is back in the outbox.",
	"recheck:unchanged":       "Recheck: the chain does not show the transfer final and unclaimed; the deposit stays failed.",
	"recheck:not_applicable":  "Recheck: this event is not a failed deposit a recheck can reverse; nothing changed.",
	"rescan:started":          "Rescan started.",
	"rescan:cancelled":        "Rescan cancelled: it is failed, its error says who and why; deposits it found stay.",
}

// render writes a page, or a 500 if the template fails (before anything
// is sent: the page is rendered into a buffer first).
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, v view) {
	c.renderTemplate(w, r, status, page, page, v)
}

func (c *Console) renderTemplate(w http.ResponseWriter, r *http.Request, status int, page, name string, v any) {
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, name, v); err != nil {
		logging.From(r.Context()).Error().Err(err).Str("page", page).Msg("console page failed to render")
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page saying what to do.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, message string) {
	c.render(w, r, status, "error", c.view(r, "", http.StatusText(status), message))
}

// storeFailed answers a storage error by its kind; its text is logged,
// never shown.
func (c *Console) storeFailed(w http.ResponseWriter, r *http.Request, err error, what string) {
	switch {
	case errors.Is(err, payment.ErrNotFound):
		c.fail(w, r, http.StatusNotFound, "No "+what+" found.")
	case errors.Is(err, payment.ErrConflict):
		c.fail(w, r, http.StatusConflict, conflictText(err))
	case errors.Is(err, payment.ErrInvalid):
		c.fail(w, r, http.StatusBadRequest, "The request is not valid for this "+what+".")
	case errors.Is(err, payment.ErrUnavailable), errors.Is(err, payment.ErrRetryable):
		w.Header().Set("Retry-After", "5")
		c.fail(w, r, http.StatusServiceUnavailable, "The database is unavailable or slow right now; try again in a few seconds.")
	default:
		logging.From(r.Context()).Error().Err(err).Str("what", what).Msg("console request failed")
		c.fail(w, r, http.StatusInternalServerError, "Internal error; the api's log has the details under this request's trace id.")
	}
}

// redirect sends the browser back to a page after an action (POST,
// redirect, GET), with a notice code.
func redirect(w http.ResponseWriter, r *http.Request, path string, query url.Values, done string) {
	if query == nil {
		query = url.Values{}
	}
	query.Set("done", done)
	http.Redirect(w, r, path+"?"+query.Encode(), http.StatusSeeOther)
}

func (c *Console) funcs() template.FuncMap {
	return template.FuncMap{
		"prefix": func() string { return Prefix },
		"ts": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				return formatTime(v)
			case *time.Time:
				if v != nil {
					return formatTime(*v)
				}
			}
			return "—"
		},
		"ago": func(t time.Time) string { return roundDuration(c.now().Sub(t)) + " ago" },
		"dur": roundDuration,
		"traceURL": func(traceID string) string {
			if c.o.TraceURL == "" || traceID == "" {
				return ""
			}
			// The tracing UI knows a UUID trace_id by its hex digits.
			if id, ok := tracing.ParseTraceID(traceID); ok {
				traceID = id.String()
			}
			return strings.ReplaceAll(c.o.TraceURL, TracePlaceholder, url.PathEscape(traceID))
		},
		"short": func(s string) string {
			if len(s) > 18 {
				return s[:10] + "…" + s[len(s)-6:]
			}
			return s
		},
		"q":    url.QueryEscape,
		"path": url.PathEscape,
		"dict": func(pairs ...any) (map[string]any, error) {
			if len(pairs)%2 != 0 {
				return nil, errors.New("dict needs key and value pairs")
			}
			m := make(map[string]any, len(pairs)/2)
			for i := 0; i < len(pairs); i += 2 {
				key, ok := pairs[i].(string)
				if !ok {
					return nil, errors.New("dict keys are strings")
				}
				m[key] = pairs[i+1]
			}
			return m, nil
		},
		"terminal": func(s payment.Status) bool { return s == payment.StatusConfirmed || s == payment.StatusFailed },
		"dash": func(s string) string {
			if s == "" {
				return "—"
			}
			return s
		},
	}
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// roundDuration says a duration the way an operator reads it.
func roundDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// conflictText says why an action could not be done, for the refusals
// the store names; any other conflict says only that.
func conflictText(err error) string {
	switch {
	case errors.Is(err, postgres.ErrDiscarded):
		return "Refused: the entry was discarded and cannot be replayed."
	case errors.Is(err, postgres.ErrReplayed):
		return "Refused: the entry was replayed and cannot be discarded."
	case errors.Is(err, postgres.ErrFailureReplayed):
		return "Refused: the failure this entry records was replayed since through another entry, so the event runs again; replay this entry to close it."
	case errors.Is(err, postgres.ErrNoEvent):
		return "Refused: the entry names no stored event; discard it instead."
	case errors.Is(err, postgres.ErrRescanEnded):
		return "Refused: the rescan already ended; only a running one can be cancelled."
	}
	return "Refused: the request conflicts with the current state; reload and look again."
}
