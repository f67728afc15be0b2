// Package config reads settings from the environment. Every reader names
// the setting in its error, an unknown value is an error and never a
// default, and a binary collects all problems before refusing to start.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Env reads settings and remembers every problem it met.
type Env struct {
	lookup func(string) (string, bool)
	errs   []error
	// refused are settings already failed as placeholders.
	refused map[string]bool
}

// FromOS reads the process environment.
func FromOS() *Env { return &Env{lookup: os.LookupEnv} }

// FromMap reads a fixed map (tests).
func FromMap(m map[string]string) *Env {
	return &Env{lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok }}
}

// FromLookup reads through lookup (tests that record which settings a
// binary reads).
func FromLookup(lookup func(string) (string, bool)) *Env { return &Env{lookup: lookup} }

// Err is the first problem, as one line naming the setting; nil if none.
func (e *Env) Err() error {
	if len(e.errs) == 0 {
		return nil
	}
	return e.errs[0]
}

// Errs lists every problem.
func (e *Env) Errs() []error { return e.errs }

func (e *Env) fail(name, format string, args ...any) {
	e.errs = append(e.errs, fmt.Errorf("setting %s: %s", name, fmt.Sprintf(format, args...)))
}

func (e *Env) raw(name string) (string, bool) {
	v, ok := e.lookup(name)
	if !ok || strings.TrimSpace(v) == "" {
		return "", false
	}
	// A shipped placeholder (deploy/k8s/secret.yaml's CHANGE-ME in a URL,
	// a token, a password) never runs, whatever the setting.
	if mark := markIn(v, placeholderMarks); mark != "" {
		if e.refused == nil {
			e.refused = map[string]bool{}
		}
		if !e.refused[name] {
			e.fail(name, "is a placeholder (contains %q): replace it", mark)
		}
		e.refused[name] = true
		return "", false
	}
	return v, true
}

// String returns the setting or def when unset.
func (e *Env) String(name, def string) string {
	if v, ok := e.raw(name); ok {
		return v
	}
	return def
}

// Required returns the setting or records that it is missing.
func (e *Env) Required(name string) string {
	v, ok := e.raw(name)
	if !ok && !e.refused[name] {
		e.fail(name, "required but not set")
	}
	return v
}

// Secret is a required setting of at least minLength characters that is
// not a placeholder (WeakSecret); "" when refused, as Required's.
func (e *Env) Secret(name string, minLength int) string {
	v := e.Required(name)
	if v == "" {
		return ""
	}
	if n := utf8.RuneCountInString(v); n < minLength {
		e.fail(name, "must be at least %d characters, got %d", minLength, n)
		return ""
	}
	if why := WeakSecret(v); why != "" {
		e.fail(name, "%s: generate one with `openssl rand -hex 32`", why)
		return ""
	}
	return v
}

// placeholderMarks make any setting a placeholder; weakSecretMarks, a
// secret (the ones this repository ships in compose.yaml, deploy/k8s and
// its docs among them).
var (
	placeholderMarks = []string{"change-me", "change_me", "changeme", "replace-me", "replace_me", "replaceme"}
	weakSecretMarks  = append([]string{"placeholder", "example"}, placeholderMarks...)
)

func markIn(v string, marks []string) string {
	lower := strings.ToLower(v)
	for _, mark := range marks {
		if strings.Contains(lower, mark) {
			return mark
		}
	}
	return ""
}

// WeakSecret says why secret is a placeholder or obviously weak, "" when
// it is neither: it contains a placeholder word, or it is at most two
// characters repeated.
func WeakSecret(secret string) string {
	if mark := markIn(secret, weakSecretMarks); mark != "" {
		return fmt.Sprintf("is a placeholder (contains %q)", mark)
	}
	distinct := map[rune]bool{}
	for _, r := range secret {
		distinct[r] = true
	}
	if len(distinct) <= 2 {
		return "is too weak (at most two distinct characters)"
	}
	return ""
}

// Duration parses Go duration syntax ("5s", "2m"); it must be positive.
func (e *Env) Duration(name string, def time.Duration) time.Duration {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		e.fail(name, "%q is not a duration like 5s or 2m", v)
		return def
	}
	if d <= 0 {
		e.fail(name, "%q must be positive", v)
		return def
	}
	return d
}

// DurationWithin is Duration within [minimum, maximum].
func (e *Env) DurationWithin(name string, def, minimum, maximum time.Duration) time.Duration {
	d := e.Duration(name, def)
	if d < minimum || d > maximum {
		e.fail(name, "%s is outside %s..%s", d, minimum, maximum)
		return def
	}
	return d
}

// Int parses an integer within [minimum, maximum].
func (e *Env) Int(name string, def, minimum, maximum int) int {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		e.fail(name, "%q is not an integer", v)
		return def
	}
	if n < minimum || n > maximum {
		e.fail(name, "%d is outside %d..%d", n, minimum, maximum)
		return def
	}
	return n
}

// Bool accepts true/false/1/0.
func (e *Env) Bool(name string, def bool) bool {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		e.fail(name, "%q is not true or false", v)
		return def
	}
	return b
}

// OneOf accepts only the listed values, spaces around them ignored as
// Int's and Bool's are.
func (e *Env) OneOf(name, def string, allowed ...string) string {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	for _, a := range allowed {
		if strings.TrimSpace(v) == a {
			return a
		}
	}
	e.fail(name, "%q is not one of %s", v, strings.Join(allowed, ", "))
	return def
}

// URL parses an absolute URL with one of the schemes; empty is allowed
// when def is empty.
func (e *Env) URL(name, def string, schemes ...string) string {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	u, err := url.Parse(v)
	if err != nil || u.Host == "" && u.Scheme != "unix" {
		e.fail(name, "is not an absolute URL")
		return def
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return v
		}
	}
	e.fail(name, "scheme %q is not one of %s", u.Scheme, strings.Join(schemes, ", "))
	return def
}

// Parse applies a custom parser and records its error against name.
func Parse[T any](e *Env, name string, def T, parse func(string) (T, error)) T {
	v, ok := e.raw(name)
	if !ok {
		return def
	}
	out, err := parse(v)
	if err != nil {
		e.fail(name, "%v", err)
		return def
	}
	return out
}

// Reject records err against the setting name (for checks done elsewhere).
func (e *Env) Reject(name string, err error) {
	if err != nil {
		e.fail(name, "%v", err)
	}
}

// ErrUsage marks a command-line mistake (exit code 2).
var ErrUsage = errors.New("usage")

// ListenAddress accepts host:port or :port with a port from 0 to 65535,
// so a listen address of a form that could never be bound stops the
// binary at start rather than after it connected to everything else (a
// host is only resolved when the listener binds).
func ListenAddress(v string) (string, error) {
	_, port, err := net.SplitHostPort(v)
	if err != nil || port == "" {
		return "", fmt.Errorf("%q is not host:port or :port", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%q: the port must be a number from 0 to 65535", v)
	}
	return v, nil
}
