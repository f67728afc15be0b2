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
	"strings"
	"sync"
	"time"
)

// Proxy bounds.
const (
	// proxyBodyMax bounds one JSON-RPC request body the proxy reads.
	proxyBodyMax = 1 << 20
	// proxyHeaderTimeout bounds reading a request's headers.
	proxyHeaderTimeout = 10 * time.Second
	// Forever makes a Proxy lie until Clear.
	Forever = -1
)

// Proxy is an HTTP JSON-RPC proxy in front of a node that can lie the way
// a lagging or load-balanced backend does: chosen calls get a canned
// result (null for a receipt the node has, an old receipt, no block),
// everything else passes through. Batches pass through untouched.
type Proxy struct {
	listener net.Listener
	server   *http.Server
	forward  *httputil.ReverseProxy

	mu    sync.Mutex
	lies  []*lie
	calls map[string]int64
	told  map[string]int64
}

type lie struct {
	method string
	param  string // first parameter, lowercase; empty: any
	result json.RawMessage
	left   int // Forever, or how many more answers
	// script, when set, answers call by call instead (nil: the node's).
	script []json.RawMessage
}

// NewProxy listens on a free local port in front of target (http URL).
func NewProxy(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("devchain: proxy target: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("devchain: proxy listen: %w", err)
	}
	p := &Proxy{listener: l, forward: httputil.NewSingleHostReverseProxy(u), calls: map[string]int64{}, told: map[string]int64{}}
	p.server = &http.Server{Handler: p, ReadHeaderTimeout: proxyHeaderTimeout}
	go func() { _ = p.server.Serve(l) }()
	return p, nil
}

// URL is the proxy's endpoint.
func (p *Proxy) URL() string { return "http://" + p.listener.Addr().String() }

// Close stops the proxy.
func (p *Proxy) Close() error { return p.server.Close() }

// Answer makes the next times calls of method (whose first parameter is
// param, if param is not empty) answer result instead of the node; times
// Forever lies until Clear. A later Answer for the same call replaces it
// (times 0 just ends it).
func (p *Proxy) Answer(method, param string, result json.RawMessage, times int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	param = strings.ToLower(param)
	for i, l := range p.lies {
		if l.method == method && l.param == param {
			p.lies = append(p.lies[:i], p.lies[i+1:]...)
			break
		}
	}
	if times > 0 || times == Forever {
		p.lies = append(p.lies, &lie{method: method, param: param, result: result, left: times})
	}
}

// Script makes the next calls of method (whose first parameter is param,
// if not empty) answer answers in turn, a nil one passing the call to the
// node; then the node answers again. It replaces any lie for that call.
func (p *Proxy) Script(method, param string, answers ...json.RawMessage) {
	p.Answer(method, param, nil, 0)
	if len(answers) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lies = append(p.lies, &lie{method: method, param: strings.ToLower(param), script: answers})
}

// NullReceipt makes the next times receipt reads of txHash answer null.
func (p *Proxy) NullReceipt(txHash string, times int) {
	p.Answer("eth_getTransactionReceipt", txHash, json.RawMessage("null"), times)
}

// Clear ends every lie.
func (p *Proxy) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lies = nil
}

// Told is how many answers of method were lies.
func (p *Proxy) Told(method string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.told[method]
}

// Calls is how many calls of method reached the proxy.
func (p *Proxy) Calls(method string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[method]
}

type rpcRequest struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, proxyBodyMax+1))
	if err != nil || len(body) > proxyBodyMax {
		http.Error(w, "request body unreadable or too large", http.StatusRequestEntityTooLarge)
		return
	}
	var req rpcRequest
	if json.Unmarshal(body, &req) == nil && req.Method != "" {
		if result, ok := p.lieFor(req); ok {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	p.forward.ServeHTTP(w, r)
}

// lieFor counts the call and answers the lie that covers it, if any.
func (p *Proxy) lieFor(req rpcRequest) (json.RawMessage, bool) {
	var first string
	if len(req.Params) > 0 {
		var s string
		if json.Unmarshal(req.Params[0], &s) == nil {
			first = strings.ToLower(s)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[req.Method]++
	for i, l := range p.lies {
		if l.method != req.Method || (l.param != "" && l.param != first) {
			continue
		}
		if l.script != nil {
			answer := l.script[0]
			if l.script = l.script[1:]; len(l.script) == 0 {
				p.lies = append(p.lies[:i], p.lies[i+1:]...)
			}
			if answer == nil {
				return nil, false
			}
			p.told[req.Method]++
			return answer, true
		}
		p.told[req.Method]++
		if l.left != Forever {
			if l.left--; l.left == 0 {
				p.lies = append(p.lies[:i], p.lies[i+1:]...)
			}
		}
		return l.result, true
	}
	return nil, false
}
