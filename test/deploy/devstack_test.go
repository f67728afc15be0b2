package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	// devStackStartMax covers building api, worker and scheduler from a
	// warm cache on a busy machine, migrations and both chains.
	devStackStartMax = 6 * time.Minute
	// devStackDemoMax: the demo waits for finality on both chains, 32
	// blocks at the test's block interval, and a withdrawal.
	devStackDemoMax = 4 * time.Minute
	devStackStopMax = time.Minute
	// devStackBlockInterval keeps an epoch (32 blocks) to a few seconds.
	devStackBlockInterval = "200ms"
)

// TestDevStackTwoNetworks runs `settlectl dev` and `settlectl demo` as a
// developer would (go tool task run, go tool task demo), on free ports:
// two simulated chains answer the chain ids of ETH_MAINNET and
// BASE_MAINNET, the worker starts with both networks, and the demo's
// deposits of ETH and of the dev token on both networks end in one
// balance per asset, with each journal row naming its network.
func TestDevStackTwoNetworks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole dev stack")
	}
	root := repoRoot(t)
	bin := filepath.Join(t.TempDir(), "settlectl")
	build := exec.Command("go", "build", "-tags", "dev", "-o", bin, "./cmd/settlectl")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	dir := t.TempDir()
	ports := freePortRun(t, 7)
	api := fmt.Sprintf("127.0.0.1:%d", ports[0])
	args := []string{"dev", "--dir", dir, "--api", api,
		"--postgres-port", fmt.Sprint(ports[1]), "--redis-port", fmt.Sprint(ports[2]),
		"--chain-port", fmt.Sprint(ports[3]), "--metrics-port", fmt.Sprint(ports[5]),
		"--block-interval", devStackBlockInterval}
	dev := exec.Command(bin, args...)
	dev.Dir = root
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := dev.StdoutPipe()
	require.NoError(t, err)
	dev.Stderr = dev.Stdout
	require.NoError(t, dev.Start())
	var devOut lockedBuffer
	running := make(chan struct{})
	go func() {
		scanner := bufio.NewScanner(stdout)
		once := sync.Once{}
		for scanner.Scan() {
			devOut.WriteString(scanner.Text() + "\n")
			if strings.Contains(scanner.Text(), "settle is running") {
				once.Do(func() { close(running) })
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		_ = dev.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			t.Logf("settlectl dev stopped: %v", err)
		case <-time.After(devStackStopMax):
			_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
			t.Logf("settlectl dev killed after %s: %v", devStackStopMax, <-exited)
		}
		if os.Geteuid() == 0 { // settlectl dev keeps root's cluster there
			sum := sha256.Sum256([]byte(dir))
			_ = os.RemoveAll(filepath.Join("/var/tmp", "settle-dev-"+hex.EncodeToString(sum[:6])))
		}
		if t.Failed() {
			for _, name := range []string{"api", "worker", "scheduler"} {
				log, _ := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
				t.Logf("%s.log ends with:\n%s", name, lastLines(string(log), 15))
			}
		}
	})
	select {
	case <-running:
	case err := <-exited:
		t.Fatalf("settlectl dev exited (%v):\n%s", err, devOut.String())
	case <-time.After(devStackStartMax):
		t.Fatalf("settlectl dev not running in %s:\n%s", devStackStartMax, devOut.String())
	}
	t.Logf("settlectl dev:\n%s", devOut.String())

	// Both chains are up and answer their network's chain id.
	var state struct {
		DatabaseURL string `json:"database_url"`
		Chains      []struct {
			Network       string `json:"network"`
			ChainID       int64  `json:"chain_id"`
			URL           string `json:"url"`
			Token         string `json:"token"`
			TokenDecimals int    `json:"token_decimals"`
		} `json:"chains"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &state))
	require.Len(t, state.Chains, 2)
	wantChains := map[string]int64{"ETH_MAINNET": 1, "BASE_MAINNET": 8453}
	wantDecimals := map[string]int{"ETH_MAINNET": 6, "BASE_MAINNET": 18}
	for _, c := range state.Chains {
		require.Equal(t, wantChains[c.Network], c.ChainID, c.Network)
		require.Equal(t, fmt.Sprintf("0x%x", c.ChainID), rpcString(t, c.URL, "eth_chainId"), "%s's chain at %s", c.Network, c.URL)
		require.NotEqual(t, "0x", rpcString(t, c.URL, "eth_getCode", c.Token, "latest"), "the dev token is deployed on %s", c.Network)
		require.Equal(t, wantDecimals[c.Network], c.TokenDecimals)
	}
	require.NotEqual(t, state.Chains[0].URL, state.Chains[1].URL)

	// The worker started with both networks (its start line), after its
	// eth_chainId check of each.
	var started struct {
		Networks []string `json:"networks"`
	}
	workerLog := waitLogLine(t, filepath.Join(dir, "logs", "worker.log"), "worker started")
	require.NoError(t, json.Unmarshal([]byte(workerLog), &started))
	require.Equal(t, []string{"ETH_MAINNET", "BASE_MAINNET"}, started.Networks)
	worker, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[5]))
	require.NoError(t, err)
	metrics, _ := io.ReadAll(worker.Body)
	worker.Body.Close()
	for network := range wantChains {
		require.Contains(t, string(metrics), `settle_chain_breaker_state{network="`+network+`"}`, "the worker has a breaker for %s", network)
	}
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "settle_chain_") {
			require.Contains(t, line, `network="`, "every chain series of the worker names its network")
		}
	}

	// The demo: deposits on both networks, one balance per asset; it
	// fails itself on any other balance.
	ctx, cancel := context.WithTimeout(context.Background(), devStackDemoMax)
	defer cancel()
	demo := exec.CommandContext(ctx, bin, "demo", "--dir", dir)
	demo.Dir = root
	demoOut, err := demo.CombinedOutput()
	t.Logf("settlectl demo:\n%s", demoOut)
	require.NoError(t, err)
	text := string(demoOut)
	require.Contains(t, text, "one ETH balance of 1.6 from the deposits on every network")
	require.Contains(t, text, "one DUSD balance of 37.5000001 from the deposits on every network")
	// Precision is the network's: seven decimals are a 400 where the dev
	// token has 6, and credited where it has 18.
	require.Regexp(t, `ETH_MAINNET \(6 decimals\): 400 .*"invalid_amount"`, text)
	require.Contains(t, text, "BASE_MAINNET (18 decimals): 200 ")
	// The journal rows it printed: each deposit on its own network.
	for _, row := range [][]string{
		{"ETH", "1.5", "deposit", "ETH_MAINNET"},
		{"ETH", "0.5", "deposit", "BASE_MAINNET"},
		{"ETH", "-0.4", "withdrawal", "ETH_MAINNET"},
		{"DUSD", "25", "deposit", "ETH_MAINNET"},
		{"DUSD", "12.5", "deposit", "BASE_MAINNET"},
		{"DUSD", "0.0000001", "deposit", "BASE_MAINNET"},
	} {
		require.True(t, hasRow(text, row), "the demo's journal shows %v:\n%s", row, text)
	}
}

// freePortRun finds n consecutive free loopback ports (the dev stack puts
// a network's chain and the scheduler's metrics on the next port).
func freePortRun(t *testing.T, n int) []int {
	t.Helper()
	for range 200 {
		base := 20_000 + rand.IntN(30_000)
		var ports []int
		var listeners []net.Listener
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				break
			}
			listeners = append(listeners, l)
			ports = append(ports, p)
		}
		for _, l := range listeners {
			l.Close()
		}
		if len(ports) == n {
			return ports
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return nil
}

func rpcString(t *testing.T, url, method string, params ...any) string {
	t.Helper()
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var answer struct {
		Result string `json:"result"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	return answer.Result
}

// waitLogLine returns the first line of a log that contains s.
func waitLogLine(t *testing.T, path, s string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, s) {
				return line
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s has no line with %q", path, s)
	return ""
}

// hasRow reports whether a line of text has exactly these fields first.
func hasRow(text string, fields []string) bool {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(fields) && strings.Join(f[:len(fields)], " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(s)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
