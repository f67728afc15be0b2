// Package redisconn turns REDIS_URL into one go-redis client shared by
// asynq and by settle's own Redis uses (rate limits, breaker state,
// caches, the DLQ fallback), so every topology works for all of them.
//
// Accepted forms:
//
//	redis://[user:password@]host:port[/db]            plain TCP
//	rediss://[user:password@]host:port[/db]           TLS
//	redis-sentinel://[user:password@]host:port[,host:port...]/master[/db]
//	                                                  Sentinel; ?sentinel_password=...
//	                                                  and ?tls=true are optional
package redisconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
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

// Options is a parsed REDIS_URL.
type Options struct {
	// Exactly one of Single and Sentinel is set.
	Single   *redis.Options
	Sentinel *redis.FailoverOptions
}

// Parse validates a REDIS_URL.
func Parse(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, errors.New("not a URL")
	}
	switch u.Scheme {
	case "redis", "rediss":
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return Options{}, err
		}
		applyTimeouts(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
		return Options{Single: opts}, nil
	case "redis-sentinel":
		return parseSentinel(u)
	}
	return Options{}, fmt.Errorf("scheme %q is not redis, rediss or redis-sentinel", u.Scheme)
}

func parseSentinel(u *url.URL) (Options, error) {
	if u.Host == "" {
		return Options{}, errors.New("redis-sentinel:// needs at least one sentinel host:port")
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) == 0 || parts[0] == "" {
		return Options{}, errors.New("redis-sentinel:// needs the master name as the first path element")
	}
	opts := &redis.FailoverOptions{MasterName: parts[0], SentinelAddrs: strings.Split(u.Host, ",")}
	if len(parts) > 1 {
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
	opts.SentinelPassword = query.Get("sentinel_password")
	opts.SentinelUsername = query.Get("sentinel_username")
	if query.Get("tls") == "true" {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	applyTimeouts(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
	return Options{Sentinel: opts}, nil
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
