package devchain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"

	"github.com/ethereum/go-ethereum/common/hexutil"
)

// LogsLimit is how a LogsLimitProxy refuses an eth_getLogs, as a
// provider words it.
type LogsLimit struct {
	// BlocksMax: ranges wider than this are refused.
	BlocksMax uint64
	// Status is the HTTP status of the refusal (200 for most providers,
	// 413 for QuickNode).
	Status  int
	Code    int
	Message string
}

// Refusals of the providers, as their documentation and users show them.
var (
	InfuraTooManyResults = LogsLimit{Status: http.StatusOK, Code: -32005, Message: "query returned more than 10000 results"}
	AlchemyResponseSize  = LogsLimit{Status: http.StatusOK, Code: -32602, Message: "Log response size exceeded. You can make eth_getLogs requests with up to a 2K block range and no limit on the response size, or you can request any block range with a cap of 10K logs in the response."}
	QuickNodeRange       = LogsLimit{Status: http.StatusRequestEntityTooLarge, Code: -32614, Message: "eth_getLogs is limited to a 10,000 range"}
)

// LogsLimitProxy is an HTTP JSON-RPC proxy in front of a node that
// refuses eth_getLogs over ranges wider than a limit, the way providers
// cap their answers; everything else (batches too) passes through.
type LogsLimitProxy struct {
	listener net.Listener
	server   *http.Server
	forward  *httputil.ReverseProxy
	limit    LogsLimit
	refused  atomic.Int64
	answered atomic.Int64
}

// NewLogsLimitProxy listens on a free local port in front of target.
func NewLogsLimitProxy(target string, limit LogsLimit) (*LogsLimitProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("devchain: proxy target: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("devchain: proxy listen: %w", err)
	}
	p := &LogsLimitProxy{listener: l, forward: httputil.NewSingleHostReverseProxy(u), limit: limit}
	p.server = &http.Server{Handler: p, ReadHeaderTimeout: proxyHeaderTimeout}
	go func() { _ = p.server.Serve(l) }()
	return p, nil
}

// URL is the proxy's endpoint.
func (p *LogsLimitProxy) URL() string { return "http://" + p.listener.Addr().String() }

// Close stops the proxy.
func (p *LogsLimitProxy) Close() error { return p.server.Close() }

// Refused counts the eth_getLogs refused; Answered those passed through.
func (p *LogsLimitProxy) Refused() int64  { return p.refused.Load() }
func (p *LogsLimitProxy) Answered() int64 { return p.answered.Load() }

func (p *LogsLimitProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, proxyBodyMax))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var call struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params []struct {
			FromBlock string `json:"fromBlock"`
			ToBlock   string `json:"toBlock"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &call) == nil && call.Method == "eth_getLogs" && len(call.Params) == 1 {
		from, errFrom := hexutil.DecodeUint64(call.Params[0].FromBlock)
		to, errTo := hexutil.DecodeUint64(call.Params[0].ToBlock)
		if errFrom == nil && errTo == nil && to >= from && to-from+1 > p.limit.BlocksMax {
			p.refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(p.limit.Status)
			msg, _ := json.Marshal(p.limit.Message)
			_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%s,"message":%s}}`, call.ID, strconv.Itoa(p.limit.Code), msg)
			return
		}
		p.answered.Add(1)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	p.forward.ServeHTTP(w, r)
}
