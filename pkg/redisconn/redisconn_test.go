package redisconn_test

import (
	"context"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/redisconn"
)

func writeCA(t *testing.T) string {
	t.Helper()
	certs, err := devenv.WriteCertificates(t.TempDir())
	require.NoError(t, err)
	return certs.CAFile
}

func TestParseSingle(t *testing.T) {
	ca := writeCA(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o644))
	cases := []struct {
		name, url string
		addr      string
		db        int
		tls       bool
		customCA  bool
		user      string
		password  string
		err       string
	}{
		{name: "plain", url: "redis://127.0.0.1:6379/3", addr: "127.0.0.1:6379", db: 3},
		{name: "default port and db", url: "redis://cache", addr: "cache:6379"},
		{name: "password only", url: "redis://:s3cret@h:1/0", addr: "h:1", password: "s3cret"},
		{name: "acl user", url: "redis://app:pw@h:1/0", addr: "h:1", user: "app", password: "pw"},
		{name: "tls", url: "rediss://redis.example.com:6380/1", addr: "redis.example.com:6380", db: 1, tls: true},
		{name: "tls with private CA", url: "rediss://h:6380/0?tls_ca_file=" + url.QueryEscape(ca), addr: "h:6380", tls: true, customCA: true},
		{name: "go-redis option kept", url: "rediss://h:6380/0?dial_timeout=5s&tls_ca_file=" + ca, addr: "h:6380", tls: true, customCA: true},
		{name: "CA without TLS", url: "redis://h:1/0?tls_ca_file=" + ca, err: "needs rediss://"},
		{name: "CA missing", url: "rediss://h:1/0?tls_ca_file=/nonexistent/ca.pem", err: "no such file"},
		{name: "CA empty", url: "rediss://h:1/0?tls_ca_file=", err: "is empty"},
		{name: "CA not PEM", url: "rediss://h:1/0?tls_ca_file=" + notPEM, err: "no PEM certificate"},
		{name: "unknown option", url: "redis://h:1/0?tls=true", err: "unexpected option"},
		{name: "db not a number", url: "redis://h:1/x", err: "invalid database"},
		{name: "no scheme", url: "localhost:6379", err: "not a URL"},
		{name: "other scheme", url: "http://h:1", err: "not redis, rediss or redis-sentinel"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts, err := redisconn.Parse(c.url)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Nil(t, opts.Sentinel)
			o := opts.Single
			require.Equal(t, c.addr, o.Addr)
			require.Equal(t, c.db, o.DB)
			require.Equal(t, c.user, o.Username)
			require.Equal(t, c.password, o.Password)
			require.Equal(t, c.tls, o.TLSConfig != nil)
			if c.tls {
				require.False(t, o.TLSConfig.InsecureSkipVerify)
				require.Equal(t, c.customCA, o.TLSConfig.RootCAs != nil, "a private CA replaces the system roots only when asked")
			}
			require.Positive(t, o.ReadTimeout, "calls are bounded")
			require.Positive(t, o.DialTimeout)
		})
	}
}

func TestParseSentinel(t *testing.T) {
	ca := writeCA(t)
	cases := []struct {
		name, url  string
		sentinels  []string
		master     string
		db         int
		user       string
		password   string
		sentUser   string
		sentPass   string
		tls        bool
		customCA   bool
		err        string
		errAbsent  string // the error must not echo this (a secret)
		errPresent string
	}{
		{name: "three sentinels", url: "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/settle/2",
			sentinels: []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, master: "settle", db: 2},
		{name: "one sentinel, db 0 implied", url: "redis-sentinel://s1:26379/mymaster", sentinels: []string{"s1:26379"}, master: "mymaster"},
		{name: "trailing slash", url: "redis-sentinel://s1:26379/mymaster/", sentinels: []string{"s1:26379"}, master: "mymaster"},
		{name: "credentials", url: "redis-sentinel://app:pw%40x@s1:1,s2:2/m/1?sentinel_username=sen&sentinel_password=spw",
			sentinels: []string{"s1:1", "s2:2"}, master: "m", db: 1, user: "app", password: "pw@x", sentUser: "sen", sentPass: "spw"},
		{name: "ipv6 sentinels", url: "redis-sentinel://[::1]:26379,[fd00::2]:26380/m",
			sentinels: []string{"[::1]:26379", "[fd00::2]:26380"}, master: "m"},
		{name: "tls", url: "redis-sentinel://s1:1/m?tls=true", sentinels: []string{"s1:1"}, master: "m", tls: true},
		{name: "tls off", url: "redis-sentinel://s1:1/m?tls=false", sentinels: []string{"s1:1"}, master: "m"},
		{name: "tls with private CA", url: "redis-sentinel://s1:1/m?tls=true&tls_ca_file=" + ca, sentinels: []string{"s1:1"}, master: "m", tls: true, customCA: true},
		{name: "CA without tls", url: "redis-sentinel://s1:1/m?tls_ca_file=" + ca, err: "needs tls=true"},
		{name: "tls misspelt value", url: "redis-sentinel://s1:1/m?tls=1", err: `tls="1" is not true or false`},
		{name: "unknown option", url: "redis-sentinel://s1:1/m?sentinel_pasword=x", err: `unknown option "sentinel_pasword"`},
		{name: "option twice", url: "redis-sentinel://s1:1/m?tls=true&tls=false", err: "given 2 times"},
		{name: "no master", url: "redis-sentinel://s1:1", err: "master name"},
		{name: "no master, only query", url: "redis-sentinel://s1:1?tls=true", err: "master name"},
		{name: "no sentinels", url: "redis-sentinel:///m", err: "at least one sentinel"},
		{name: "sentinel without port", url: "redis-sentinel://s1,s2:2/m", err: "sentinel 1 of 2 is not host:port"},
		{name: "empty entry", url: "redis-sentinel://s1:1,,s2:2/m", err: "sentinel 2 of 3 is not host:port"},
		{name: "bad port", url: "redis-sentinel://s1:0/m", err: "port is not 1..65535"},
		{name: "db not a number", url: "redis-sentinel://s1:1/m/x", err: `database "x"`},
		{name: "negative db", url: "redis-sentinel://s1:1/m/-1", err: `database "-1"`},
		{name: "path too long", url: "redis-sentinel://s1:1/m/0/extra", err: "is not /master or /master/db"},
		{name: "fragment", url: "redis-sentinel://s1:1/m#x", err: "no #fragment"},
		{name: "secret not echoed", url: "redis-sentinel://app:topsecret@s1/m", err: "not host:port", errAbsent: "topsecret"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts, err := redisconn.Parse(c.url)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				if c.errAbsent != "" {
					require.NotContains(t, err.Error(), c.errAbsent)
				}
				return
			}
			require.NoError(t, err)
			require.Nil(t, opts.Single)
			o := opts.Sentinel
			require.Equal(t, c.sentinels, o.SentinelAddrs)
			require.Equal(t, c.master, o.MasterName)
			require.Equal(t, c.db, o.DB)
			require.Equal(t, c.user, o.Username)
			require.Equal(t, c.password, o.Password)
			require.Equal(t, c.sentUser, o.SentinelUsername)
			require.Equal(t, c.sentPass, o.SentinelPassword)
			require.Equal(t, c.tls, o.TLSConfig != nil)
			if c.tls {
				require.Equal(t, c.customCA, o.TLSConfig.RootCAs != nil)
				require.Empty(t, o.TLSConfig.ServerName, "each server is verified under the name it is dialled by")
			}
			require.Positive(t, o.ReadTimeout)
		})
	}
}

// TestTLSConnection talks to a real TLS-only redis-server whose
// certificate comes from a private CA: trusted through tls_ca_file it
// works; with the system roots alone the handshake is refused.
// TestParseNeverEchoesAMisplacedPassword: a password pasted unescaped
// (openssl rand -base64 has '/' and '+') ends the host at its '/', '?' or
// '#', so its pieces would be read as a host, a path or an option; the
// error says how to write it and quotes none of it.
func TestParseNeverEchoesAMisplacedPassword(t *testing.T) {
	const before, after = "k9Qx7Lm2Zt", "pWq3xYz"
	for _, raw := range []string{
		"redis-sentinel://:" + before + "/" + after + "@s1:26379,s2:26379/mymaster",
		"redis-sentinel://app:" + before + "/" + after + "@s1:26379/m",
		"redis-sentinel://app:26379/" + after + "@s1:26379/m",
		"redis-sentinel://app:" + before + "?" + after + "@s1:26379/m",
		"redis-sentinel://app:" + before + "#" + after + "@s1:26379/m",
		"redis://:" + before + "/" + after + "@r1:6379/0",
		"redis://app:6379/" + after + "@r1:6379/0",
		"rediss://app:6379?" + after + "@r1:6379/0",
		"redis://app:6379#" + after + "@r1:6379/0",
	} {
		_, err := redisconn.Parse(raw)
		require.ErrorContains(t, err, "percent-encoded", raw)
		for _, piece := range []string{before, after} {
			require.NotContains(t, err.Error(), piece, raw)
		}
	}
	// An '@' where one may stand still parses.
	for _, raw := range []string{
		"redis-sentinel://s1:1/m?sentinel_password=p@ss",
		"redis-sentinel://:" + before + "%2F" + after + "@s1:1/m",
		"redis://:" + before + "%2F" + after + "@r1:6379/0",
	} {
		_, err := redisconn.Parse(raw)
		require.NoError(t, err, raw)
	}
	// A bad entry in the list is counted, not quoted.
	_, err := redisconn.Parse("redis-sentinel://s1:1," + before + "/m")
	require.EqualError(t, err, "sentinel 2 of 2 is not host:port")
}

func TestTLSConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server, err := devenv.StartRedisTLS(ctx)
	require.NoError(t, err)
	t.Cleanup(server.Close)

	rdb, err := redisconn.Open(server.URL(2))
	require.NoError(t, err)
	defer rdb.Close()
	require.NoError(t, rdb.Set(ctx, "settle:tls", "ok", time.Minute).Err())
	got, err := rdb.Get(ctx, "settle:tls").Result()
	require.NoError(t, err)
	require.Equal(t, "ok", got)

	untrusted, err := redisconn.Open("rediss://" + server.Addr() + "/2")
	require.NoError(t, err)
	defer untrusted.Close()
	err = untrusted.Ping(ctx).Err()
	var unknownAuthority x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknownAuthority, "the private CA is not trusted by default: %v", err)

	plain, err := redisconn.Open("redis://" + server.Addr() + "/2")
	require.NoError(t, err)
	defer plain.Close()
	require.Error(t, plain.Ping(ctx).Err(), "a TLS-only port refuses plain TCP")
}

// FuzzParse: REDIS_URL is outside input; Parse never panics, and what it
// accepts has exactly one topology.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"redis://127.0.0.1:6379/0", "rediss://h:6380/1?skip_verify=true", "redis-sentinel://a:1,b:2/m/3?tls=true",
		"redis-sentinel://u:p@[::1]:26379/m", "redis-sentinel://", "redis-sentinel://@/", "rediss://h/0?tls_ca_file=",
		"redis-sentinel://a:1/m?sentinel_password=x&sentinel_username=y",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if strings.Contains(raw, "tls_ca_file") {
			return // reads files; covered by the table tests
		}
		opts, err := redisconn.Parse(raw)
		if err != nil {
			return
		}
		if (opts.Single == nil) == (opts.Sentinel == nil) {
			t.Fatalf("%q: exactly one of Single and Sentinel must be set", raw)
		}
		if opts.Sentinel != nil && (len(opts.Sentinel.SentinelAddrs) == 0 || opts.Sentinel.MasterName == "") {
			t.Fatalf("%q: a sentinel topology without sentinels or master", raw)
		}
	})
}
