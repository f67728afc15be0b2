// Package redisconn turns REDIS_URL into one go-redis client shared by
// asynq and by settle's own Redis uses (rate limits, breaker state,
// caches, the DLQ fallback), so every topology works for all of them.
//
// Accepted forms:
//
//	redis://[user:password@]host:port[/db]            plain TCP
//	rediss://[user:password@]host:port[/db]           TLS
//	redis-sentinel://[user:password@]host:port[,host:port...]/master[/db]
//	                                                  Sentinel
//
// The user and password are the data nodes' (Redis ACL or requirepass).
// redis:// and rediss:// take go-redis's query options (dial_timeout,
// pool_size, skip_verify, ...). redis-sentinel:// takes only these:
//
//	sentinel_username, sentinel_password  the Sentinels' own credentials
//	tls=true|false                        TLS to the Sentinels and the data nodes
//
// Both TLS forms take tls_ca_file=/path/ca.pem: a PEM bundle of the CAs
// trusted for the server's certificate instead of the system's roots (a
// private CA, as managed Redis services use). Hosts in a Sentinel list
// may be IPv6 literals in brackets.
package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timeouts for every Redis call: a stuck Redis turns into errors quickly,
// which the callers handle (fallbacks, retries), instead of hangs.
const (
	DialTimeout  = 2 * time.Second
	ReadTimeout  = 2 * time.Second
	WriteTimeout = 2 * time.Second
)

// Limits on what a URL may ask for.
const (
	sentinelsMax = 16
	caFileMax    = 1 << 20
)

const (
	paramCAFile           = "tls_ca_file"
	paramTLS              = "tls"
	paramSentinelUsername = "sentinel_username"
	paramSentinelPassword = "sentinel_password"
	sentinelScheme        = "redis-sentinel"
)

// Options is a parsed REDIS_URL.
type Options struct {
	// Exactly one of Single and Sentinel is set.
	Single   *redis.Options
	Sentinel *redis.FailoverOptions
}

// Parse validates a REDIS_URL. It reads tls_ca_file, so a missing or
// unreadable CA fails here, at start, rather than at the first call.
func Parse(raw string) (Options, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Options{}, errors.New("not a URL (expected redis://, rediss:// or redis-sentinel://)")
	}
	if misplacedAt(rest) {
		// A password with an unescaped '/', '?' or '#' ends the host
		// there, so what follows would be quoted back as a host, a path
		// or an option: the error names no part of the URL.
		return Options{}, errors.New("an '@' after the host: a password with '/', '?' or '#' in it must be percent-encoded (%2F, %3F, %23)")
	}
	switch scheme {
	case "redis", "rediss":
		return parseSingle(raw)
	case sentinelScheme:
		return parseSentinel(raw)
	}
	return Options{}, fmt.Errorf("scheme %q is not redis, rediss or redis-sentinel", scheme)
}

func parseSingle(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, errors.New("not a URL")
	}
	// tls_ca_file is ours; go-redis refuses options it does not know.
	query := u.Query()
	caFile, withCA := query.Get(paramCAFile), query.Has(paramCAFile)
	if withCA {
		if u.Scheme != "rediss" {
			return Options{}, fmt.Errorf("%s needs rediss:// (TLS)", paramCAFile)
		}
		query.Del(paramCAFile)
		u.RawQuery = query.Encode()
		raw = u.String()
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return Options{}, err
	}
	if withCA {
		if opts.TLSConfig.RootCAs, err = loadCAs(caFile); err != nil {
			return Options{}, err
		}
	}
	applyTimeouts(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
	return Options{Single: opts}, nil
}

// parseSentinel reads the host list itself: net/url takes one host, and
// rejects a list of bracketed IPv6 addresses.
func parseSentinel(raw string) (Options, error) {
	rest := strings.TrimPrefix(raw, sentinelScheme+"://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	// The placeholder host lets net/url decode everything else.
	u, err := url.Parse(sentinelScheme + "://" + userinfo + "sentinels" + tail)
	if err != nil {
		return Options{}, errors.New("not a URL")
	}
	if u.Fragment != "" {
		return Options{}, errors.New("redis-sentinel:// takes no #fragment")
	}
	addrs, err := sentinelAddrs(hosts)
	if err != nil {
		return Options{}, err
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if parts[0] == "" {
		return Options{}, errors.New("redis-sentinel:// needs the master name as the first path element")
	}
	if len(parts) > 2 {
		return Options{}, fmt.Errorf("path %q is not /master or /master/db", u.Path)
	}
	opts := &redis.FailoverOptions{MasterName: parts[0], SentinelAddrs: addrs}
	if len(parts) == 2 {
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return Options{}, fmt.Errorf("database %q is not a number", parts[1])
		}
		opts.DB = db
	}
	if u.User != nil {
		opts.Username = u.User.Username()
		opts.Password, _ = u.User.Password()
	}
	query := u.Query()
	for name, values := range query {
		switch name {
		case paramSentinelUsername, paramSentinelPassword, paramTLS, paramCAFile:
		default:
			return Options{}, fmt.Errorf("unknown option %q (redis-sentinel:// takes %s, %s, %s and %s)",
				name, paramSentinelUsername, paramSentinelPassword, paramTLS, paramCAFile)
		}
		if len(values) > 1 {
			return Options{}, fmt.Errorf("option %q given %d times", name, len(values))
		}
	}
	opts.SentinelUsername = query.Get(paramSentinelUsername)
	opts.SentinelPassword = query.Get(paramSentinelPassword)
	switch query.Get(paramTLS) {
	case "", "false":
	case "true":
		// crypto/tls takes each server's name from the address it dials.
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	default:
		return Options{}, fmt.Errorf("tls=%q is not true or false", query.Get(paramTLS))
	}
	if query.Has(paramCAFile) {
		if opts.TLSConfig == nil {
			return Options{}, fmt.Errorf("%s needs tls=true", paramCAFile)
		}
		if opts.TLSConfig.RootCAs, err = loadCAs(query.Get(paramCAFile)); err != nil {
			return Options{}, err
		}
	}
	applyTimeouts(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
	return Options{Sentinel: opts}, nil
}

// misplacedAt reports an '@' past the authority of rest (the URL after
// "://") while the authority has none: in the path or fragment, or in an
// option's name. None of them takes one, and a user info whose password
// holds a '/', '?' or '#' unescaped looks just so. An '@' in an option's
// value (sentinel_password=p@ss) is fine.
func misplacedAt(rest string) bool {
	end := strings.IndexAny(rest, "/?#")
	if end < 0 || strings.Contains(rest[:end], "@") {
		return false
	}
	after := rest[end:]
	query, fragment := "", ""
	if i := strings.IndexByte(after, '#'); i >= 0 {
		after, fragment = after[:i], after[i:]
	}
	if i := strings.IndexByte(after, '?'); i >= 0 {
		after, query = after[:i], after[i+1:]
	}
	if strings.Contains(after, "@") || strings.Contains(fragment, "@") {
		return true
	}
	for _, option := range strings.Split(query, "&") {
		name, _, _ := strings.Cut(option, "=")
		if strings.Contains(name, "@") {
			return true
		}
	}
	return false
}

// sentinelAddrs checks the host list. Its errors count entries rather than
// quote them: a misplaced password can end up in the list.
func sentinelAddrs(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, errors.New("redis-sentinel:// needs at least one sentinel host:port")
	}
	list := strings.Split(hosts, ",")
	if len(list) > sentinelsMax {
		return nil, fmt.Errorf("%d sentinels (at most %d)", len(list), sentinelsMax)
	}
	addrs := make([]string, 0, len(list))
	for i, hostPort := range list {
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil || host == "" {
			return nil, fmt.Errorf("sentinel %d of %d is not host:port", i+1, len(list))
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("sentinel %d of %d: port is not 1..65535", i+1, len(list))
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

func loadCAs(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, fmt.Errorf("%s is empty", paramCAFile)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", paramCAFile, err)
	}
	if info.Size() > caFileMax {
		return nil, fmt.Errorf("%s %s: larger than %d bytes", paramCAFile, path, caFileMax)
	}
	pem, err := os.ReadFile(path) //nolint:gosec // G304: the operator names the CA file in the Redis URL
	if err != nil {
		return nil, fmt.Errorf("%s: %w", paramCAFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", paramCAFile, path)
	}
	return pool, nil
}

func applyTimeouts(dial, read, write *time.Duration) {
	if *dial == 0 {
		*dial = DialTimeout
	}
	if *read == 0 {
		*read = ReadTimeout
	}
	if *write == 0 {
		*write = WriteTimeout
	}
}

// Client builds the go-redis client.
func (o Options) Client() redis.UniversalClient {
	if o.Sentinel != nil {
		return redis.NewFailoverClient(o.Sentinel)
	}
	return redis.NewClient(o.Single)
}

// Open parses raw and returns a client.
func Open(raw string) (redis.UniversalClient, error) {
	opts, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	return opts.Client(), nil
}
