package logging

import (
	"errors"
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
	for e := err; e != nil; {
		var ue *url.Error
		if !errors.As(e, &ue) {
			break
		}
		if ue.URL != "" {
			if short := URL(ue.URL); short != ue.URL {
				// url.Error prints the URL with %q.
				msg = strings.ReplaceAll(msg, strconv.Quote(ue.URL), strconv.Quote(short))
				msg, changed = strings.ReplaceAll(msg, ue.URL, short), true
			}
		}
		e = ue.Err
	}
	if !changed {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }

// Unwrap keeps errors.Is working (timeouts, refused connections); the
// wrapped error still holds the URL, so print e, never what it wraps.
func (e *redactedError) Unwrap() error { return e.err }
