package chain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// The secrets of the endpoint the echo tests dial.
const (
	echoKey      = "SECRETKEY0123456789abcdef"
	echoQueryKey = "QUERYKEY0123456789abcdef"
	echoPassword = "hunter2hunter2"
)

// echoServer stands where a node's path is not served: a web server or
// proxy whose error page repeats what was asked, or a node whose JSON-RPC
// error does. mode picks the answer.
type echoServer struct {
	*httptest.Server
	mode atomic.Value // string
}

func newEchoServer(t *testing.T) *echoServer {
	s := &echoServer{}
	s.mode.Store("apache")
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *echoServer) serve(w http.ResponseWriter, r *http.Request) {
	asked := r.URL.RequestURI() // path and query, as sent
	user, password, _ := r.BasicAuth()
	switch s.mode.Load().(string) {
	case "apache":
		// A big page (the client keeps up to 64 KiB of it) that names
		// the URL at its top and again at its end.
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "<html><body><h1>Not Found</h1>\n<p>The requested URL %s was not found on this server.</p>\n", asked)
		fmt.Fprintf(w, "<!-- %s -->\n", strings.Repeat("padding ", 4<<10))
		fmt.Fprintf(w, "<address>Apache Server, URL %s</address></body></html>\n", asked)
	case "spring":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"timestamp":"2025-01-01T00:00:00Z","status":404,"error":"Not Found","path":%q,"user":%q}`, asked, user+":"+password)
	case "jetty":
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "HTTP ERROR 404 Not Found\nURI:\t%s\nSTATUS:\t404\nMESSAGE:\tNot Found\nSERVLET:\t-\n", r.URL.EscapedPath())
	case "rpcerror":
		// The node's own answer: a JSON-RPC error per request that names
		// the endpoint it was asked on (a single call or a batch).
		s.answerRPCError(w, r, -32000, "backend unavailable for "+asked)
	case "nomethod":
		s.answerRPCError(w, r, rpcMethodNotFound, "the method is not available on "+asked)
	case "logslimit":
		s.answerRPCError(w, r, -32005, "query returned more than 10000 results on "+asked)
	}
}

func (s *echoServer) answerRPCError(w http.ResponseWriter, r *http.Request, code int, message string) {
	body, _ := io.ReadAll(r.Body)
	type request struct {
		ID json.RawMessage `json:"id"`
	}
	answer := func(id json.RawMessage) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": message}}
	}
	w.Header().Set("Content-Type", "application/json")
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
		var reqs []request
		_ = json.Unmarshal(body, &reqs)
		out := make([]map[string]any, 0, len(reqs))
		for _, q := range reqs {
			out = append(out, answer(q.ID))
		}
		_ = json.NewEncoder(w).Encode(out)
		return
	}
	var q request
	_ = json.Unmarshal(body, &q)
	_ = json.NewEncoder(w).Encode(answer(q.ID))
}

// fieldsAlerter keeps every alert's fields.
type fieldsAlerter struct {
	mu     sync.Mutex
	fields []map[string]any
}

func (a *fieldsAlerter) Raise(_ string, _ alert.Severity, _ string, fields map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fields = append(a.fields, fields)
}

func (a *fieldsAlerter) text() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprint(a.fields)
}

// syncBuffer is a log sink safe for the breaker's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func requireNoEchoedSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, secret := range []string{echoKey, echoQueryKey, echoPassword} {
		require.NotContains(t, text, secret, "%s: %.2000s", what, text)
	}
}

// TestErrorPageEchoingTheEndpointHidesItsSecrets: a server in front of the
// node (Apache "The requested URL /v3/<key> was not found", Spring's
// "path", Jetty's "URI:") or the node itself repeats the requested path in
// its answer, which is no *url.Error: every call's error, the breaker's
// alert (last_error) and its log line keep the key, the query and the
// password out, the page is cut to a line, and the error's kinds survive.
func TestErrorPageEchoingTheEndpointHidesItsSecrets(t *testing.T) {
	srv := newEchoServer(t)
	endpoint := strings.Replace(srv.URL, "http://", "http://user:"+echoPassword+"@", 1) + "/v3/" + echoKey + "?apikey=" + echoQueryKey
	logs := &syncBuffer{}
	// Calls: a breaker that never opens, so each one reaches the server.
	dial := func(t *testing.T, chainID int64) *Client {
		c, err := Dial(context.Background(), endpoint, ClientOptions{
			Logger: zerolog.New(logs), Registerer: prometheus.NewRegistry(), ChainID: chainID,
			Breaker: BreakerSettings{ErrorsMax: 1 << 20, ErrorWindow: time.Minute},
		})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	ctx := zerolog.New(logs).WithContext(context.Background())
	tx := MinedTx{Hash: "0x" + strings.Repeat("ab", 32), BlockNumber: 1}
	calls := map[string]func(c *Client) error{
		"header":   func(c *Client) error { _, err := c.HeaderByTag(ctx, TagFinalized); return err },
		"receipt":  func(c *Client) error { _, err := c.Receipt(ctx, tx.Hash); return err },
		"tx":       func(c *Client) error { _, err := c.Transaction(ctx, tx.Hash); return err },
		"chain id": func(c *Client) error { _, err := c.ChainID(ctx); return err },
		"blocks":   func(c *Client) error { _, err := c.Blocks(ctx, []uint64{1, 2}); return err },
		"statuses": func(c *Client) error { _, err := c.ReceiptStatuses(ctx, []MinedTx{tx}); return err },
		"traces":   func(c *Client) error { _, err := c.InternalTransfers(ctx, []uint64{1, 2}); return err },
		"probe":    func(c *Client) error { return c.ProbeTraces(ctx, true) },
		"logs": func(c *Client) error {
			_, err := c.ContractTransferLogs(ctx, 1, 2, []string{"0x" + strings.Repeat("11", 20)}, 10)
			return err
		},
		"tx hashes": func(c *Client) error { _, _, err := c.BlockTxHashes(ctx, 1); return err },
	}
	for _, mode := range []string{"apache", "spring", "jetty", "rpcerror", "nomethod", "logslimit"} {
		srv.mode.Store(mode)
		for name, call := range calls {
			for _, chainID := range []int64{0, 1} { // 1: eth_chainId is asked first
				c := dial(t, chainID)
				err := call(c)
				require.Error(t, err, "%s %s", mode, name)
				what := fmt.Sprintf("%s %s (chain id %d)", mode, name, chainID)
				requireNoEchoedSecret(t, what, err.Error())
				require.LessOrEqual(t, len(err.Error()), errorTextMax+len("…"), what)
				switch {
				case errors.Is(err, ErrTracesUnsupported), errors.Is(err, ErrLogsLimit):
				default:
					require.ErrorIs(t, err, payment.ErrUnavailable, what)
				}
				var httpErr rpc.HTTPError
				var rpcErr rpc.Error
				require.True(t, errors.As(err, &httpErr) || errors.As(err, &rpcErr) || errors.Is(err, ErrTracesUnsupported) || errors.Is(err, ErrLogsLimit),
					"%s: the node's error is still in the chain: %v", what, err)
			}
		}
	}
	srv.mode.Store("nomethod")
	require.ErrorIs(t, dial(t, 0).ProbeTraces(ctx, true), ErrTracesUnsupported, "a code is still read through the redaction")
	_, err := dial(t, 0).InternalTransfers(ctx, []uint64{1})
	require.ErrorIs(t, err, ErrTracesUnsupported)
	srv.mode.Store("logslimit")
	_, err = dial(t, 0).ContractTransferLogs(ctx, 1, 2, []string{"0x" + strings.Repeat("11", 20)}, 10)
	require.ErrorIs(t, err, ErrLogsLimit)
	require.Contains(t, err.Error(), "query returned more than 10000 results on [redacted]")

	srv.mode.Store("apache")
	_, err = dial(t, 0).HeaderByTag(ctx, TagLatest)
	require.Contains(t, err.Error(), "404 Not Found: <html><body><h1>Not Found</h1> <p>The requested URL [redacted] was not found", "the page's start says what went wrong")
	var httpErr rpc.HTTPError
	require.ErrorAs(t, err, &httpErr)
	require.Equal(t, http.StatusNotFound, httpErr.StatusCode)

	// The breaker's alert and log line carry the call's error.
	alerts := &fieldsAlerter{}
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := Dial(context.Background(), endpoint, ClientOptions{
		Logger: zerolog.New(logs), Registerer: prometheus.NewRegistry(), Alerter: alerts, Redis: rdb,
		Breaker: BreakerSettings{ErrorsMax: 1, ErrorWindow: time.Minute, OpenFor: time.Hour},
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	_, err = c.HeaderByTag(ctx, TagLatest)
	require.ErrorAs(t, err, &httpErr)
	require.NotEmpty(t, alerts.text(), "the breaker opened and alerted")
	require.Contains(t, alerts.text(), "last_error")
	requireNoEchoedSecret(t, "alerts", alerts.text())
	require.Contains(t, logs.String(), "ethereum rpc breaker opened")
	requireNoEchoedSecret(t, "logs", logs.String())
}
