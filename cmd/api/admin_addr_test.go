package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
)

func TestAdminAddrSettings(t *testing.T) {
	for name, c := range map[string]struct{ admin, want string }{
		"not an address":    {"admin", "ADMIN_ADDR"},
		"same as HTTP_ADDR": {":8080", "ADMIN_ADDR: must differ from HTTP_ADDR"},
	} {
		t.Run(name, func(t *testing.T) {
			settings := validSettings()
			settings["ADMIN_ADDR"] = c.admin
			var stderr bytes.Buffer
			require.Equal(t, exitFailure, run(nil, config.FromMap(settings), &stderr))
			require.Contains(t, stderr.String(), c.want)
		})
	}
}

// The real binary with ADMIN_ADDR: the public listener answers the admin
// surface 404 not_found; the admin listener serves it.
func TestAdminAddrSplitsTheListeners(t *testing.T) {
	ports := make([]int, 2)
	for i := range ports {
		port, err := devenv.FreePort()
		require.NoError(t, err)
		ports[i] = port
	}
	public, admin := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	settings := validSettings()
	settings["DATABASE_URL"] = testenv.DatabaseURL(t)
	settings["REDIS_URL"] = testenv.RedisURL(t)
	settings["HTTP_ADDR"] = public
	settings["ADMIN_ADDR"] = admin
	settings[runMainEnv] = "1"

	cmd := exec.Command(os.Args[0])
	cmd.Env = testenv.Env(settings)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(base, path, token string) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodGet, "http://"+base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var body map[string]any
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			require.NoError(t, json.Unmarshal(raw, &body))
		}
		return resp.StatusCode, body
	}
	deadline := time.Now().Add(waitLimit)
	for {
		publicReady, _ := get(public, "/readyz", "")
		adminReady, _ := get(admin, "/readyz", "")
		if publicReady == http.StatusOK && adminReady == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("api exited early (%v): %s", err, stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("api never became ready: %s", stderr.String())
		}
	}

	adminToken := validSettings()["ADMIN_TOKEN"]
	for _, path := range []string{"/metrics", "/openapi.yaml", "/admin/dlq", "/admin/queues/"} {
		status, body := get(public, path, adminToken)
		require.Equal(t, http.StatusNotFound, status, path)
		require.Equal(t, "not_found", body["code"], path)
		status, _ = get(admin, path, adminToken)
		require.Equal(t, http.StatusOK, status, path)
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0 expected: %s", stderr.String())
	case <-time.After(waitLimit):
		t.Fatalf("api did not stop: %s", stderr.String())
	}
	require.Contains(t, stderr.String(), "api stopped cleanly")
}
