package config_test

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
)

// setting is the variable every reader of the fuzz target reads.
const setting = "SETTLE_FUZZ"

var (
	// secretRefusal is every error a secret may get: nothing of the value
	// but its length and a placeholder word it contains.
	secretRefusal = regexp.MustCompile("^(required but not set" +
		`|is a placeholder \(contains "([a-z_-]+)"\)(: replace it|: generate one with ` + "`openssl rand -hex 32`)" +
		`|must be at least ([0-9]+) characters, got ([0-9]+)` +
		`|is too weak \(at most two distinct characters\): generate one with ` + "`openssl rand -hex 32`)$")
	// weakness is every reason WeakSecret gives.
	weakness = regexp.MustCompile(`^(is a placeholder \(contains "[a-z_-]+"\)|is too weak \(at most two distinct characters\))$`)
	// urlRefusal is every error a URL may get: of the value, its scheme
	// alone, which holds no userinfo and no query.
	urlRefusal = regexp.MustCompile(`^(is not an absolute URL|scheme ("[a-z0-9+.-]*") is not one of (.*))$`)
)

// FuzzEnvReaders feeds one value to every reader. Each records at most one
// error, naming the setting on one line, and returns its default with it;
// or returns a value the reader's own rule accepts, which reads back the
// same once formatted again. A placeholder is refused by every reader; a
// secret's value, a URL's password or query never shows in an error.
func FuzzEnvReaders(f *testing.F) {
	for _, seed := range []string{
		"", " ", "\t\n", "0", "1", "-1", "+7", " 42 ", "65535", "65536", "9223372036854775807", "-9223372036854775808",
		"9223372036854775808", "0x10", "1_000", "true", "FALSE", "t", "yes", "5s", " 2m ", "0s", "-1s", "1h0m0.5s",
		"2562047h47m16.854775807s", "1e3s", ".5m", "info", "debug ", "INFO",
		":8080", "127.0.0.1:9091", "[::1]:0", "localhost:65535", ":", ":99999", ":-0", ":+80", "[fe80::1%eth0]:80",
		"https://hooks.example.com/x", "http://user:hunter2secret@host:8545/path?token=abc123#frag",
		"redis://:p%40ss@redis:6379/0", "rediss://redis.internal:6380", "unix:///run/redis.sock", "//host/only",
		"hooks.example/SECRETPATH", "https://[::1", "HTTPS://Host/", "ftp://files.example.com", "ab://x:ab@h",
		"postgres://settle:CHANGE-ME@postgres.example.internal:5432/settle", "https://CHANGE-ME.example.invalid/eth",
		"3f9c1a7be04d2c58a6e1f0b9d7c3a2e5", "a-placeholder-that-is-long-enough-0123456789",
		strings.Repeat("ab", 20), "é\xff\xfe\xfdabcdefghijklmnopqrstuvwxyz0123456789", "\"quoted\"\r\nnext line",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		checkStringReaders(t, value)
		checkSecret(t, value)
		checkNumbers(t, value)
		checkDurations(t, value)
		checkOneOf(t, value)
		checkURL(t, value, "", "https", "http")
		checkURL(t, value, "redis://localhost:6379/0", "redis", "rediss", "unix")
		checkListenAddress(t, value)
		checkParse(t, value)
		checkPlaceholderRefusedOnce(t, value)
	})
}

// read runs reader on value as the setting and returns what it gave and
// its error without the "setting NAME: " all errors start with ("" for
// none).
func read[T any](t *testing.T, value string, reader func(*config.Env) T) (T, string) {
	t.Helper()
	env := config.FromMap(map[string]string{setting: value})
	got := reader(env)
	errs := env.Errs()
	require.LessOrEqual(t, len(errs), 1, "one read of %q recorded %d errors: %q", value, len(errs), errs)
	if len(errs) == 0 {
		require.NoError(t, env.Err())
		return got, ""
	}
	require.Equal(t, errs[0], env.Err())
	msg := errs[0].Error()
	require.True(t, strings.HasPrefix(msg, "setting "+setting+": "), "the error does not name the setting: %q", msg)
	require.NotContains(t, msg, "\n", "the error is not one line")
	require.NotContains(t, msg, "\r", "the error is not one line")
	rest := strings.TrimPrefix(msg, "setting "+setting+": ")
	require.NotEmpty(t, rest, "the error says nothing")
	return got, rest
}

// placeholderIn is the placeholder word the value contains, as the
// refusal names it (the first of the list); "" for none.
func placeholderIn(value string) string {
	lower := strings.ToLower(value)
	for _, mark := range config.PlaceholderMarks {
		if strings.Contains(lower, mark) {
			return mark
		}
	}
	return ""
}

// unread checks a read of a value no reader takes (blank, or a
// placeholder) and says whether it was one: the default comes back, with
// the placeholder refused and a blank required one missing.
func unread[T comparable](t *testing.T, value string, got, def T, msg string, required bool) bool {
	t.Helper()
	if strings.TrimSpace(value) == "" {
		require.Equal(t, def, got, "blank %q", value)
		if required {
			require.Equal(t, "required but not set", msg)
		} else {
			require.Empty(t, msg, "a blank setting is unset")
		}
		return true
	}
	if mark := placeholderIn(value); mark != "" {
		require.Equal(t, def, got, "placeholder %q", value)
		require.Equal(t, fmt.Sprintf("is a placeholder (contains %q): replace it", mark), msg)
		return true
	}
	return false
}

func checkStringReaders(t *testing.T, value string) {
	got, msg := read(t, value, func(e *config.Env) string { return e.String(setting, "def") })
	if !unread(t, value, got, "def", msg, false) {
		require.Empty(t, msg)
		require.Equal(t, value, got)
	}
	got, msg = read(t, value, func(e *config.Env) string { return e.Required(setting) })
	if !unread(t, value, got, "", msg, true) {
		require.Empty(t, msg)
		require.Equal(t, value, got)
	}
}

func checkSecret(t *testing.T, value string) {
	const minLength = 32
	weak := config.WeakSecret(value)
	if weak != "" {
		require.Regexp(t, weakness, weak)
	} else {
		distinct := map[rune]bool{}
		for _, r := range value {
			distinct[r] = true
		}
		require.Greater(t, len(distinct), 2, "WeakSecret passed %q", value)
	}

	got, msg := read(t, value, func(e *config.Env) string { return e.Secret(setting, minLength) })
	if msg != "" {
		// The refusal is one of a few fixed texts, so the value is not in it.
		m := secretRefusal.FindStringSubmatch(msg)
		require.NotNil(t, m, "a secret's refusal %q is not one of its fixed texts", msg)
		if m[2] != "" {
			require.Contains(t, strings.ToLower(value), m[2], "the placeholder named is not in the value")
		}
		if m[4] != "" {
			require.Equal(t, strconv.Itoa(minLength), m[4])
			require.Equal(t, strconv.Itoa(utf8.RuneCountInString(value)), m[5], "characters, not bytes")
		}
	}
	if unread(t, value, got, "", msg, true) {
		return
	}
	if utf8.RuneCountInString(value) >= minLength && weak == "" {
		require.Empty(t, msg, "a strong secret was refused")
	}
	if msg != "" {
		require.Empty(t, got, "a refused secret was returned")
		return
	}
	require.Equal(t, value, got)
	require.GreaterOrEqual(t, utf8.RuneCountInString(value), minLength)
	require.Empty(t, weak)
}

func checkNumbers(t *testing.T, value string) {
	for _, c := range []struct{ def, minimum, maximum int }{
		{5, 1, 10}, {8080, 0, 65535}, {-3, -5, -1}, {0, math.MinInt, math.MaxInt},
	} {
		readInt := func(v string) (int, string) {
			return read(t, v, func(e *config.Env) int { return e.Int(setting, c.def, c.minimum, c.maximum) })
		}
		got, msg := readInt(value)
		if unread(t, value, got, c.def, msg, false) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(value))
		if err == nil && n >= c.minimum && n <= c.maximum {
			require.Empty(t, msg, "%q within %d..%d refused", value, c.minimum, c.maximum)
		}
		if msg != "" {
			require.Equal(t, c.def, got, "a refused value gave no default")
			continue
		}
		require.Equal(t, n, got)
		require.True(t, got >= c.minimum && got <= c.maximum, "%d outside %d..%d", got, c.minimum, c.maximum)
		again, msg := readInt(strconv.Itoa(got))
		require.Empty(t, msg)
		require.Equal(t, got, again)
	}

	got, msg := read(t, value, func(e *config.Env) bool { return e.Bool(setting, true) })
	if unread(t, value, got, true, msg, false) {
		return
	}
	b, err := strconv.ParseBool(strings.TrimSpace(value))
	if err == nil {
		require.Empty(t, msg)
	}
	if msg != "" {
		require.True(t, got, "a refused value gave no default")
		return
	}
	require.Equal(t, b, got)
	again, msg := read(t, strconv.FormatBool(got), func(e *config.Env) bool { return e.Bool(setting, !got) })
	require.Empty(t, msg)
	require.Equal(t, got, again)
}

func checkDurations(t *testing.T, value string) {
	const def, minimum, maximum = 7 * time.Second, time.Second, time.Hour
	parsed, parseErr := time.ParseDuration(strings.TrimSpace(value))

	got, msg := read(t, value, func(e *config.Env) time.Duration { return e.Duration(setting, def) })
	if unread(t, value, got, def, msg, false) {
		return
	}
	if parseErr == nil && parsed > 0 {
		require.Empty(t, msg, "positive %q refused", value)
	}
	if msg != "" {
		require.Equal(t, def, got, "a refused value gave no default")
	} else {
		require.Equal(t, parsed, got)
		require.Positive(t, got)
		again, msg := read(t, got.String(), func(e *config.Env) time.Duration { return e.Duration(setting, def) })
		require.Empty(t, msg)
		require.Equal(t, got, again, "%s reads back as %s", got, again)
	}

	got, msg = read(t, value, func(e *config.Env) time.Duration { return e.DurationWithin(setting, def, minimum, maximum) })
	if parseErr == nil && parsed >= minimum && parsed <= maximum {
		require.Empty(t, msg, "%q within %s..%s refused", value, minimum, maximum)
	}
	if msg != "" {
		require.Equal(t, def, got, "a refused value gave no default")
		return
	}
	require.Equal(t, parsed, got)
	require.True(t, got >= minimum && got <= maximum, "%s outside %s..%s", got, minimum, maximum)
}

func checkOneOf(t *testing.T, value string) {
	allowed := []string{"debug", "info", "warn", "error"}
	got, msg := read(t, value, func(e *config.Env) string { return e.OneOf(setting, "info", allowed...) })
	if unread(t, value, got, "info", msg, false) {
		return
	}
	for _, a := range allowed {
		if strings.TrimSpace(value) == a {
			require.Empty(t, msg, "%q refused", value)
		}
	}
	if msg != "" {
		require.Equal(t, "info", got, "a refused value gave no default")
		return
	}
	require.Equal(t, strings.TrimSpace(value), got)
	require.Contains(t, allowed, got)
}

func checkURL(t *testing.T, value, def string, schemes ...string) {
	got, msg := read(t, value, func(e *config.Env) string { return e.URL(setting, def, schemes...) })
	if unread(t, value, got, def, msg, false) {
		return
	}
	u, parseErr := url.Parse(value)
	absolute := parseErr == nil && (u.Host != "" || u.Scheme == "unix")
	if msg != "" {
		require.Equal(t, def, got, "a refused value gave no default")
		m := urlRefusal.FindStringSubmatch(msg)
		require.NotNil(t, m, "a URL's refusal %q is not one of its fixed texts", msg)
		if m[2] != "" {
			// The scheme alone: never the password or the query.
			require.True(t, absolute, "%q refused for its scheme, but it is not absolute", value)
			require.Equal(t, strconv.Quote(u.Scheme), m[2])
			require.Equal(t, strings.Join(schemes, ", "), m[3])
		}
		if absolute {
			require.NotContains(t, schemes, u.Scheme, "%q of an allowed scheme refused", value)
		}
		return
	}
	require.Equal(t, value, got)
	require.NoError(t, parseErr, "%q accepted", value)
	require.True(t, absolute, "%q accepted, but it is not absolute", value)
	require.Contains(t, schemes, u.Scheme, "%q accepted", value)
}

func checkListenAddress(t *testing.T, value string) {
	const def = ":9091"
	got, msg := read(t, value, func(e *config.Env) string { return config.Parse(e, setting, def, config.ListenAddress) })
	if unread(t, value, got, def, msg, false) {
		return
	}
	host, port, splitErr := net.SplitHostPort(value)
	n, portErr := strconv.Atoi(port)
	if splitErr == nil && portErr == nil && n >= 0 && n <= 65535 {
		require.Empty(t, msg, "%q refused", value)
	}
	if msg != "" {
		require.Equal(t, def, got, "a refused value gave no default")
		require.True(t, strings.HasPrefix(msg, strconv.Quote(value)), "the refusal does not quote the value: %q", msg)
		return
	}
	require.Equal(t, value, got)
	require.NoError(t, splitErr, "%q accepted", value)
	require.NoError(t, portErr, "%q accepted", value)
	require.True(t, n >= 0 && n <= 65535, "%q accepted with port %d", value, n)
	_, err := config.ListenAddress(net.JoinHostPort(host, port))
	require.NoError(t, err, "%q accepted, but not once joined again", value)
	if host == "" || net.ParseIP(host) != nil {
		// An IP or no host needs no DNS: what net.Listen would resolve.
		_, err := net.ResolveTCPAddr("tcp", value)
		require.NoError(t, err, "%q accepted, but it cannot be bound", value)
	}
}

func checkParse(t *testing.T, value string) {
	var seen []string
	parse := func(v string) (uint16, error) {
		seen = append(seen, v)
		n, err := strconv.ParseUint(v, 10, 16)
		return uint16(n), err
	}
	got, msg := read(t, value, func(e *config.Env) uint16 { return config.Parse(e, setting, 7, parse) })
	if unread(t, value, got, 7, msg, false) {
		require.Empty(t, seen, "the parser was handed an unset or placeholder value")
		return
	}
	require.Equal(t, []string{value}, seen, "the parser was not handed the value as set")
	n, err := strconv.ParseUint(value, 10, 16)
	if err != nil {
		require.Equal(t, err.Error(), msg)
		require.Equal(t, uint16(7), got, "a refused value gave no default")
		return
	}
	require.Empty(t, msg)
	require.Equal(t, uint16(n), got)
}

// checkPlaceholderRefusedOnce: a placeholder read by several readers is
// one problem, not one per read.
func checkPlaceholderRefusedOnce(t *testing.T, value string) {
	if placeholderIn(value) == "" {
		return
	}
	env := config.FromMap(map[string]string{setting: value})
	env.String(setting, "")
	env.Required(setting)
	env.Secret(setting, 32)
	env.URL(setting, "", "https")
	require.Len(t, env.Errs(), 1, "%q", env.Errs())
}
