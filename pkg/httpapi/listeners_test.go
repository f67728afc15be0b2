package httpapi_test

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/adminapi"
	"github.com/settle/settle/pkg/httpapi"
)

// splitServer serves h's server on a public and an admin listener, as
// the api does with ADMIN_ADDR, and returns their base URLs.
func splitServer(t *testing.T, h *harness) (public, admin string) {
	t.Helper()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	al, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.server.ServeSplit(ctx, pl, al, 10*time.Second) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return "http://" + pl.Addr().String(), "http://" + al.Addr().String()
}

// With ADMIN_ADDR the public listener knows no admin route, /metrics or
// /openapi.yaml (a JSON not_found, whatever the method or credentials),
// and the admin listener serves them; the rest is served on both.
func TestAdminListener(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.AdminRoutes = adminapi.Routes(nil)
		o.AdminMounts = []httpapi.Mount{adminapi.Dashboard(o.Redis, true)}
	}})
	public, admin := splitServer(t, h)
	basic := map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+adminToken))}

	for _, c := range []struct {
		method, path string
		headers      map[string]string
	}{
		{http.MethodPut, "/admin/users/5", bearer(adminToken)},
		{http.MethodGet, "/admin/users/5", bearer(adminToken)}, // 405 on the admin listener
		{http.MethodGet, "/admin/dlq", bearer(adminToken)},
		{http.MethodGet, "/admin/queues/", basic},
		{http.MethodGet, "/admin/queues/", nil},
		{http.MethodGet, "/admin/queues", nil},
		{http.MethodGet, "/metrics", nil},
		{http.MethodGet, "/openapi.yaml", nil},
	} {
		h.url = public
		r := h.do(c.method, c.path, nil, c.headers)
		requireCode(t, r, http.StatusNotFound, httpapi.CodeNotFound)
		require.Empty(t, r.header.Values("WWW-Authenticate"), "%s %s: the public listener does not ask for credentials", c.method, c.path)
	}

	h.url = admin
	r := h.do(http.MethodPut, "/admin/users/5", nil, bearer(adminToken))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
	requireCode(t, h.do(http.MethodGet, "/admin/users/5", nil, bearer(adminToken)), http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/admin/queues/", nil, basic).status)
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/metrics", nil, nil).status)
	require.Equal(t, httpapi.OpenAPISpec(), h.do(http.MethodGet, "/openapi.yaml", nil, nil).raw)

	for _, base := range []string{public, admin} {
		h.url = base
		require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/healthz", nil, nil).status)
		r := h.do(http.MethodGet, "/v1/users/5/balances", nil, bearer(apiToken))
		require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
		require.Equal(t, http.StatusOK, h.postPayment(deposit("split-"+base, 5, "1")).status)
	}
}

// Without ADMIN_ADDR one listener serves everything, and the dashboard's
// 401 asks for Basic on a line of its own.
func TestOneListenerServesAll(t *testing.T) {
	h := newHarness(t, harnessOptions{change: func(o *httpapi.Options) {
		o.AdminMounts = []httpapi.Mount{adminapi.Dashboard(o.Redis, true)}
	}})
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, "/metrics", nil, nil).status)
	r := h.do(http.MethodGet, "/admin/queues/", nil, nil)
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	require.Equal(t, []string{`Basic realm="settle"`, `Bearer realm="settle"`}, r.header.Values("WWW-Authenticate"))
	// Typed without its slash, the dashboard's name sends a browser there
	// (the query kept); the login is asked for there.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(h.url + "/admin/queues?tab=1")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	require.Equal(t, "/admin/queues/?tab=1", resp.Header.Get("Location"))
	r = h.do(http.MethodGet, "/admin/queues", nil, nil)
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	require.Equal(t, []string{`Basic realm="settle"`, `Bearer realm="settle"`}, r.header.Values("WWW-Authenticate"))
	// A bearer-only route offers only Bearer: a browser must not pop a
	// login box for an API route.
	r = h.do(http.MethodPut, "/admin/users/5", nil, nil)
	requireCode(t, r, http.StatusUnauthorized, httpapi.CodeUnauthorized)
	require.Equal(t, []string{`Bearer realm="settle"`}, r.header.Values("WWW-Authenticate"))
}
