package logging

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// URL is raw reduced to its scheme and host ("https://hooks.example.com"),
// the only parts of a URL fit for a log line or a table: a webhook's path,
// an RPC endpoint's path (API keys), a query and user info are secrets.
// Anything unparsable is "[redacted]".
func URL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "[redacted]"
	}
	return u.Scheme + "://" + u.Host
}

// RedactError returns err with the URL of every *url.Error in its chain
// reduced by URL: net/http's client errors embed the whole request URL
// (`Post "https://host/secret/path": dial tcp ...`). Other errors pass
// through unchanged.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	msg, changed := err.Error(), false
	// The whole tree: errors.Join (several networks' calls, a retry's
	// attempts) can hold more than one client error.
	var walk func(e error, depth int)
	walk = func(e error, depth int) {
		if e == nil || depth > redactDepthMax {
			return
		}
		// Each node is looked at by itself: errors.As would stop at the
		// first match and never see the others.
		if ue, ok := e.(*url.Error); ok && ue.URL != "" { //nolint:errorlint // one node, not the chain
			if short := URL(ue.URL); short != ue.URL {
				// url.Error prints the URL with %q.
				msg = strings.ReplaceAll(msg, strconv.Quote(ue.URL), strconv.Quote(short))
				msg, changed = strings.ReplaceAll(msg, ue.URL, short), true
			}
		}
		switch u := e.(type) { //nolint:errorlint // unwrapping by hand
		case interface{ Unwrap() error }:
			walk(u.Unwrap(), depth+1)
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner, depth+1)
			}
		}
	}
	walk(err, 0)
	if !changed {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// redactDepthMax bounds the walk of an error tree (a cycle, or a chain
// built by a loop).
const redactDepthMax = 64

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }

// Unwrap keeps errors.Is working (timeouts, refused connections); the
// wrapped error still holds the URL, so print e, never what it wraps.
func (e *redactedError) Unwrap() error { return e.err }

// Redacted is err printed as msg (err's text with secrets taken out):
// errors.Is and errors.As still see err and what it wraps.
func Redacted(err error, msg string) error {
	if err == nil || msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// Redactor takes the secret parts of known endpoint URLs out of any text,
// wherever they appear: a server's error page or a library's message may
// repeat the requested path ("The requested URL /v3/<key> was not found"),
// which no *url.Error marks.
type Redactor struct {
	// urls are the whole endpoints, shown as URL gives them.
	urls []string
	// secrets are the parts of them to hide, longest first.
	secrets []string
}

// redactedText stands in for a secret.
const redactedText = "[redacted]"

// Secret parts shorter than these are too common to stand for a secret
// ("/", "/rpc"): a path, query or user info as a whole needs
// secretWholeMin bytes; one segment or value of them, which may equal an
// ordinary word ("ethereum", "mainnet"), needs secretPieceMin.
const (
	secretWholeMin = 4
	secretPieceMin = 16
)

// NewRedactor hides the path (raw and escaped), the query, the user info
// and the key-like segments and values of each of rawURLs. Unparsable
// URLs are hidden whole.
func NewRedactor(rawURLs ...string) *Redactor {
	r := &Redactor{}
	seen := map[string]bool{}
	add := func(s string, least int) {
		if len(s) < least || strings.Trim(s, "/") == "" || seen[s] {
			return
		}
		seen[s] = true
		r.secrets = append(r.secrets, s)
	}
	for _, raw := range rawURLs {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			add(raw, 1)
			continue
		}
		// As given, and as a client may rebuild it (without its user
		// info, which goes in a header, or without its query).
		bare := *u
		bare.User = nil
		noQuery := bare
		noQuery.RawQuery, noQuery.ForceQuery = "", false
		for _, whole := range []string{raw, u.String(), bare.String(), noQuery.String()} {
			if whole != URL(whole) && !seen[whole] {
				seen[whole] = true
				r.urls = append(r.urls, whole)
			}
		}
		if u.RawQuery != "" {
			// As a request names it: one secret, not two around a '?'.
			add(u.RequestURI(), secretWholeMin)
			add(u.Path+"?"+u.RawQuery, secretWholeMin)
		}
		add(u.Path, secretWholeMin)
		add(u.EscapedPath(), secretWholeMin)
		add(u.RawPath, secretWholeMin)
		add(u.RawQuery, secretWholeMin)
		if q, err := url.QueryUnescape(u.RawQuery); err == nil {
			add(q, secretWholeMin)
		}
		for _, segment := range strings.Split(u.Path, "/") {
			add(segment, secretPieceMin)
			add(url.PathEscape(segment), secretPieceMin)
		}
		for _, values := range u.Query() {
			for _, v := range values {
				add(v, secretPieceMin)
				add(url.QueryEscape(v), secretPieceMin)
			}
		}
		if u.User != nil {
			add(u.User.String(), secretWholeMin)
			add(u.User.Username(), secretPieceMin)
			if password, ok := u.User.Password(); ok {
				add(password, secretWholeMin)
				add(url.QueryEscape(password), secretWholeMin)
			}
		}
	}
	// Longest first: a path goes as one, not as a segment inside it.
	slices.SortStableFunc(r.urls, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	slices.SortStableFunc(r.secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return r
}

// String is s with each endpoint shortened by URL and every secret part
// left replaced by "[redacted]".
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, u := range r.urls {
		s = strings.ReplaceAll(s, u, URL(u))
	}
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, redactedText)
	}
	return s
}

// Error is RedactError(err) with String applied to its text.
func (r *Redactor) Error(err error) error {
	if err == nil {
		return nil
	}
	return Redacted(err, r.String(RedactError(err).Error()))
}

// Cut is s cut to at most n bytes of valid UTF-8, marked "…" when cut:
// for a peer's words (an error page) in a log line, a row or an alert.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
