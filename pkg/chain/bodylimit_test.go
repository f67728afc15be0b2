//go:build !fuzzing

package chain

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ethereum/go-ethereum/rpc"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// testResponseMax is the bound the tests set: small, so that answers of
// many times it stream quickly.
const testResponseMax = 1 << 20

// padNode stands between the client and the dev chain and pads the
// chain's real answers with leading whitespace (still valid JSON), as
// long as asked, streamed, optionally gzipped or announced in
// Content-Length, or under another status.
type padNode struct {
	target   string
	server   *httptest.Server
	pad      atomic.Int64
	gzip     atomic.Bool
	announce atomic.Bool
	status   atomic.Int32 // 0: the chain's
	// gzipAsked: the client offered gzip and got it; wire counts the
	// bytes written to the connection (compressed, when gzipped).
	gzipAsked atomic.Bool
	wire      atomic.Int64
}

const padChunk = 32 << 10

func newPadNode(t *testing.T, target string) *padNode {
	t.Helper()
	n := &padNode{target: target}
	n.server = httptest.NewServer(n)
	t.Cleanup(n.server.Close)
	return n
}

func (n *padNode) URL() string { return n.server.URL }

func (n *padNode) set(pad int64, gzipped, announce bool, status int) {
	n.pad.Store(pad)
	n.gzip.Store(gzipped)
	n.announce.Store(announce)
	n.status.Store(int32(status))
	n.gzipAsked.Store(false)
	n.wire.Store(0)
}

func (n *padNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	resp, err := http.Post(n.target, "application/json", bytes.NewReader(req))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	answer, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return
	}
	status := resp.StatusCode
	if s := n.status.Load(); s != 0 {
		status = int(s)
	}
	pad := n.pad.Load()
	w.Header().Set("Content-Type", "application/json")
	var out io.Writer = writeCounter{w: w, n: &n.wire}
	if n.gzip.Load() && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		n.gzipAsked.Store(true)
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(out)
		defer func() { _ = gz.Close() }()
		out = gz
	} else if n.announce.Load() {
		w.Header().Set("Content-Length", strconv.FormatInt(pad+int64(len(answer)), 10))
	}
	w.WriteHeader(status)
	spaces := bytes.Repeat([]byte(" "), padChunk)
	for left := pad; left > 0; {
		k := min(left, padChunk)
		if _, err := out.Write(spaces[:k]); err != nil {
			return // the client hung up
		}
		left -= k
	}
	_, _ = out.Write(answer)
}

type writeCounter struct {
	w io.Writer
	n *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// countingTransport counts the body bytes the client read from base
// (after base's own gzip decompression): what the client held, at most.
type countingTransport struct {
	base http.RoundTripper
	read atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err == nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &t.read}
	}
	return resp, err
}

// TestResponseBound: an answer longer than RPC_RESPONSE_MAX (streamed,
// announced, or a gzip bomb inflating past it) fails the call with
// ErrResponseTooLarge after reading at most the bound, through a caller's
// own HTTPClient too; an answer under it passes, gzipped or not; a long
// error body is cut at rpcErrorBodyMax.
func TestResponseBound(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	node := newPadNode(t, ch.URL())
	counted := &countingTransport{base: &http.Transport{}}
	client, err := Dial(ctx, node.URL(), ClientOptions{
		HTTPClient: &http.Client{Transport: counted}, ResponseMax: testResponseMax,
		Breaker: BreakerSettings{ErrorsMax: 1000},
	})
	require.NoError(t, err)
	t.Cleanup(client.Close)

	for _, tc := range []struct {
		name     string
		pad      int64
		gzip     bool
		announce bool
		status   int
		fails    bool
	}{
		{name: "plain answer"},
		{name: "just under the bound", pad: testResponseMax - 8<<10},
		{name: "gzipped under the bound", pad: testResponseMax - 8<<10, gzip: true},
		{name: "twice the bound, streamed", pad: 2 * testResponseMax, fails: true},
		{name: "64 times the bound, streamed", pad: 64 * testResponseMax, fails: true},
		{name: "gzip bomb", pad: 64 * testResponseMax, gzip: true, fails: true},
		{name: "announced too long", pad: 2 * testResponseMax, announce: true, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node.set(tc.pad, tc.gzip, tc.announce, tc.status)
			counted.read.Store(0)
			h, err := client.HeaderByTag(ctx, TagLatest)
			read := counted.read.Load()
			if tc.gzip {
				require.True(t, node.gzipAsked.Load(), "the transport asked for gzip and inflated it")
			}
			if !tc.fails {
				require.NoError(t, err)
				require.NotEmpty(t, h.Hash)
				require.GreaterOrEqual(t, read, tc.pad, "the padding was read")
				return
			}
			require.ErrorIs(t, err, ErrResponseTooLarge)
			require.ErrorIs(t, err, payment.ErrUnavailable, "callers ask again later")
			require.ErrorContains(t, err, "RPC_RESPONSE_MAX=1048576 bytes", "the error names the setting")
			require.LessOrEqual(t, read, int64(testResponseMax+1), "at most the bound was read")
			if tc.announce {
				require.Zero(t, read, "an announced length over the bound is not read at all")
			}
			if tc.gzip {
				require.Less(t, node.wire.Load(), tc.pad/100, "a bomb: a little on the wire inflates past the bound")
			}
		})
	}

	t.Run("long error body", func(t *testing.T) {
		node.set(2*testResponseMax, false, false, http.StatusBadGateway)
		counted.read.Store(0)
		_, err := client.HeaderByTag(ctx, TagLatest)
		var httpErr rpc.HTTPError
		require.ErrorAs(t, err, &httpErr)
		require.Equal(t, http.StatusBadGateway, httpErr.StatusCode)
		require.Zero(t, len(httpErr.Body), "the body over the bound is dropped")
		require.Less(t, len(err.Error()), 1000, "and never reaches logs")
		require.LessOrEqual(t, counted.read.Load(), int64(rpcErrorBodyMax+1))
	})

	t.Run("batch", func(t *testing.T) {
		node.set(2*testResponseMax, false, false, 0)
		counted.read.Store(0)
		_, err := client.Blocks(ctx, []uint64{0, 0})
		require.ErrorIs(t, err, ErrResponseTooLarge)
		require.LessOrEqual(t, counted.read.Load(), int64(testResponseMax+1))
		node.set(0, false, false, 0)
		blocks, err := client.Blocks(ctx, []uint64{0, 0})
		require.NoError(t, err)
		require.Len(t, blocks, 2)
	})
}

// TestResponseBoundDefaultTransport: without an HTTPClient the transport
// Dial builds is bounded too.
func TestResponseBoundDefaultTransport(t *testing.T) {
	ctx := testContext(t)
	node := newPadNode(t, startChain(t).URL())
	client, err := Dial(ctx, node.URL(), ClientOptions{ResponseMax: testResponseMax})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	_, err = client.HeaderByTag(ctx, TagLatest)
	require.NoError(t, err)
	node.set(2*testResponseMax, true, false, 0)
	_, err = client.HeaderByTag(ctx, TagLatest)
	require.ErrorIs(t, err, ErrResponseTooLarge)
	require.True(t, node.gzipAsked.Load())

	_, err = Dial(ctx, node.URL(), ClientOptions{ResponseMax: -1})
	require.Error(t, err, "a negative bound")
}

// TestResponseBoundBreaker: answers over the bound are the endpoint
// failing (they open the breaker), except eth_getLogs, where an answer
// over it is ErrLogsLimit like a provider's "too many results": the
// scanner asks over fewer blocks, and the breaker stays closed.
func TestResponseBoundBreaker(t *testing.T) {
	ctx := testContext(t)
	node := newPadNode(t, startChain(t).URL())
	client, err := Dial(ctx, node.URL(), ClientOptions{ResponseMax: testResponseMax})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	contracts := []string{"0x1111111111111111111111111111111111111111"}

	node.set(2*testResponseMax, false, false, 0)
	for range 3 * BreakerErrorsMaxDefault {
		_, err := client.ContractTransferLogs(ctx, 0, 0, contracts, 100)
		require.ErrorIs(t, err, ErrLogsLimit)
		require.ErrorContains(t, err, "RPC_RESPONSE_MAX")
		_, err = client.TransferLogs(ctx, 0, 0, contracts, contracts)
		require.ErrorIs(t, err, ErrLogsLimit)
	}
	node.set(0, false, false, 0)
	logs, err := client.ContractTransferLogs(ctx, 0, 0, contracts, 100)
	require.NoError(t, err, "the breaker is closed")
	require.Empty(t, logs)

	node.set(2*testResponseMax, false, false, 0)
	for range BreakerErrorsMaxDefault {
		_, err := client.HeaderByTag(ctx, TagLatest)
		require.ErrorIs(t, err, ErrResponseTooLarge)
	}
	node.set(0, false, false, 0)
	_, err = client.HeaderByTag(ctx, TagLatest)
	require.ErrorIs(t, err, ErrBreakerOpen, "the over-long answers opened it")
}
