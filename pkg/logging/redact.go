package logging

import (
	"net/url"
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
