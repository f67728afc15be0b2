package test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/test/harness"
)

// Sizes of the slow-body attack.
const (
	attackers       = 64
	attackBodyBytes = 4 << 20 // /webhook/alchemy's limit
	attackChunk     = 64 << 10
	// attackHold is how long each attacker keeps its body one byte short.
	attackHold = 3 * time.Second
	// attackGrowthMax bounds the api's growth during the attack; without
	// the budget it would be attackers × 4 MiB = 256 MiB.
	attackGrowthMax = 64 << 20
)

// slowAttacker posts a 4 MiB unsigned body to /webhook/alchemy from one
// address (through X-Forwarded-For) and keeps its last byte back for
// attackHold; it returns the status the api answered (0: none before the
// attacker gave up).
func slowAttacker(t *testing.T, addr, from string) int {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /webhook/alchemy HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Alchemy-Signature: %s\r\nX-Forwarded-For: %s\r\n\r\n",
		addr, attackBodyBytes, strings.Repeat("0", 64), from)
	if _, err := conn.Write([]byte(head)); err != nil {
		return 0
	}
	status := make(chan int, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(attackHold + 20*time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			status <- 0
			return
		}
		_ = resp.Body.Close()
		status <- resp.StatusCode
	}()
	chunk := bytes.Repeat([]byte("a"), attackChunk)
	for sent := 0; sent < attackBodyBytes-1; {
		n := min(attackChunk, attackBodyBytes-1-sent)
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(chunk[:n]); err != nil {
			break // refused: the api closed the connection
		}
		sent += n
		select {
		case code := <-status:
			return code
		default:
		}
	}
	select {
	case code := <-status:
		return code
	case <-time.After(attackHold):
	}
	_ = conn.(*net.TCPConn).CloseWrite()
	return <-status
}

// rssBytes reads a /proc/<pid>/status field (VmRSS, VmHWM) in bytes.
func rssBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// heapBytes reads the api's own go_memstats_heap_inuse_bytes.
func heapBytes(t *testing.T, base string) int64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		if rest, ok := strings.CutPrefix(scanner.Text(), "go_memstats_heap_inuse_bytes "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			require.NoError(t, err)
			return int64(v)
		}
	}
	return 0
}

// TestSlowUnverifiedBodiesKeepMemoryBounded: 64 slow 4 MiB unsigned
// bodies from 64 addresses of one IPv6 /64 hold at most that client's
// share of the unverified budget (the rest are refused 503 at once), the
// api's memory grows by far less than 64 × 4 MiB, and a signed payment
// sent meanwhile is accepted.
func TestSlowUnverifiedBodiesKeepMemoryBounded(t *testing.T) {
	s := harness.NewStack(t)
	api := s.StartAPI(map[string]string{
		"TRUSTED_PROXIES":     "127.0.0.1/32",
		"WEBHOOK_RATE_LIMIT":  "30/s,300/m",
		"ALCHEMY_SIGNING_KEY": "whsec_attack-test-key",
	})
	client := harness.NewClient(api.URL())
	status, _, err := client.Admin(http.MethodPut, "/admin/users/7", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	baseRSS, baseHeap := rssBytes(t, api.Pid(), "VmRSS"), heapBytes(t, api.URL())

	var peakHeap, peakRSS atomic.Int64
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peakHeap.Store(max(peakHeap.Load(), heapBytes(t, api.URL())))
			peakRSS.Store(max(peakRSS.Load(), rssBytes(t, api.Pid(), "VmRSS")))
			select {
			case <-sampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	var wg sync.WaitGroup
	codes := make([]int, attackers)
	addr := fmt.Sprintf("127.0.0.1:%d", api.Port)
	for i := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = slowAttacker(t, addr, fmt.Sprintf("2001:db8:bad:cafe:%x::%x", i, i+1))
		}()
	}
	time.Sleep(attackHold / 2)
	begin := time.Now()
	status, body, err := client.Webhook(harness.Payment("during-attack", "deposit", 7, "ETH", "1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "a signed webhook flows during the attack: %v", body)
	t.Logf("signed webhook during the attack answered in %s", time.Since(begin))
	wg.Wait()
	close(sampling)
	<-sampled

	refused := 0
	for _, code := range codes {
		if code == http.StatusServiceUnavailable {
			refused++
		}
	}
	growthRSS, growthHeap := peakRSS.Load()-baseRSS, peakHeap.Load()-baseHeap
	t.Logf("attackers refused 503 at once: %d of %d; heap in use %d MiB → peak +%d MiB; RSS %d MiB → peak +%d MiB (race binaries: %v)",
		refused, attackers, baseHeap>>20, growthHeap>>20, baseRSS>>20, growthRSS>>20, harness.RaceBinaries())
	require.GreaterOrEqual(t, refused, attackers-2, "one /64 holds at most two 4 MiB reservations (8 MiB share)")
	require.Less(t, growthHeap, int64(attackGrowthMax), "the api's heap stays bounded")
	if !harness.RaceBinaries() {
		// The race detector's shadow memory multiplies RSS; the heap bound
		// above holds either way.
		require.Less(t, growthRSS, int64(attackGrowthMax), "the api's RSS stays bounded")
	}
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM payment_events`))
}
