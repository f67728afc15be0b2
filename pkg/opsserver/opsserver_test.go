package opsserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/opsserver"
	"github.com/settle/settle/pkg/service"
	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// proxy forwards TCP to target until closed (then refuses connections).
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// TestReadyzRevealsNoInternals: /readyz of worker and scheduler is
// unauthenticated on METRICS_ADDR (every interface by default), so with
// PostgreSQL and Redis down it answers as the api's does, each dependency's
// state and no driver text: that names the database user, the database
// and internal hosts.
func TestReadyzRevealsNoInternals(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	p := startProxy(t, u.Host)
	u.Host = p.l.Addr().String()
	db := testenv.OpenDB(t, u.String())
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	p.close() // PostgreSQL now unreachable

	port, err := devenv.FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := opsserver.New(addr, prometheus.NewRegistry(), service.ReadyCheck(db, rdb), zerolog.Nop())
	require.NoError(t, s.Start())
	defer func() { _ = s.Shutdown(context.Background()) }()

	client := &http.Client{Timeout: 10 * time.Second}
	var body []byte
	var resp *http.Response
	// The first probe may meet a pooled connection the proxy cut; the
	// next ones dial afresh.
	for range 3 {
		resp, err = client.Get("http://" + addr + "/readyz")
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		t.Logf("readyz: %d %s", resp.StatusCode, body)
	}
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	var answer struct {
		Error   string            `json:"error"`
		Code    string            `json:"code"`
		Checks  map[string]string `json:"checks"`
		TraceID string            `json:"trace_id"`
	}
	require.NoError(t, json.Unmarshal(body, &answer))
	require.Equal(t, "not ready", answer.Error)
	require.Equal(t, opsserver.CodeUnavailable, answer.Code)
	require.Equal(t, map[string]string{"postgres": "unreachable", "redis": "unreachable", "migrations": "unknown"}, answer.Checks)
	require.Equal(t, resp.Header.Get("X-Request-ID"), answer.TraceID)
	user := u.User.Username()
	database := strings.TrimPrefix(u.Path, "/")
	for _, internal := range []string{"user=" + user, "database=" + database, p.l.Addr().String(), "127.0.0.1:1"} {
		require.NotContains(t, string(body), internal, "unauthenticated /readyz reveals %q: %s", internal, body)
	}
}

// TestReadyzReady: a process whose dependencies are fine answers 200 with
// each one's state, in the api's shape.
func TestReadyzReady(t *testing.T) {
	db := testenv.DB(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	port, err := devenv.FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := opsserver.New(addr, prometheus.NewRegistry(), service.ReadyCheck(db, rdb), zerolog.Nop())
	require.NoError(t, s.Start())
	defer func() { _ = s.Shutdown(context.Background()) }()

	resp, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.JSONEq(t, `{"status":"ready","checks":{"postgres":"ok","redis":"ok","migrations":"current"},"trace_id":"`+resp.Header.Get("X-Request-ID")+`"}`, string(body))
}

// TestUnknownRoutesAnswerJSON: what the ops server does not serve answers
// in the api's error shape with a code: 404, or 405 with Allow for a
// route another method takes.
func TestUnknownRoutesAnswerJSON(t *testing.T) {
	port, err := devenv.FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := opsserver.New(addr, prometheus.NewRegistry(), func(context.Context) (map[string]string, error) { return nil, nil }, zerolog.Nop())
	require.NoError(t, s.Start())
	defer func() { _ = s.Shutdown(context.Background()) }()
	for _, c := range []struct {
		method, path, code, allow string
		status                    int
	}{
		{http.MethodGet, "/nope", "not_found", "", http.StatusNotFound},
		{http.MethodPost, "/metrics", "method_not_allowed", "GET, HEAD", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/readyz", "method_not_allowed", "GET, HEAD", http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		require.NoError(t, err)
		req.Header.Set("X-Request-ID", "probe-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s %s", c.method, c.path)
		require.Equal(t, c.allow, resp.Header.Get("Allow"), "%s %s", c.method, c.path)
		var got map[string]string
		require.NoError(t, json.Unmarshal(body, &got), string(body))
		require.Equal(t, c.code, got["code"], "%s %s", c.method, c.path)
		require.Equal(t, "probe-1", got["trace_id"])
	}
}
