package testenv

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// CutProxy is a TCP proxy to a PostgreSQL server that, once armed, drops
// the connection whose server answers with a given command tag, and that
// answer with it: the command is done (a COMMIT durable), but the client
// never learns it, as when a connection breaks after the server answered.
type CutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	tag    []byte
	cuts   atomic.Int32
	wg     sync.WaitGroup
}

// NewCutProxy proxies dsn's server; the dsn returned goes through it.
func NewCutProxy(t testing.TB, dsn string) (*CutProxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &CutProxy{ln: ln, target: u.Host}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

// Arm cuts the next connection whose server completes a command with tag
// (CommandComplete's text: "COMMIT", "INSERT 0 1").
func (p *CutProxy) Arm(tag string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tag = append([]byte(tag), 0)
}

// Cuts is how many connections were cut.
func (p *CutProxy) Cuts() int { return int(p.cuts.Load()) }

// cut reports whether an answer carries the armed tag, and disarms.
func (p *CutProxy) cut(answer []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tag == nil || !bytes.Contains(answer, p.tag) {
		return false
	}
	p.tag = nil
	p.cuts.Add(1)
	return true
}

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.wg.Add(2)
		go p.copy(server, client, false)
		go p.copy(client, server, true)
	}
}

// copy moves bytes from src to dst, closing both when either ends; an
// answer from the server (fromServer) with the armed tag is dropped.
func (p *CutProxy) copy(dst, src net.Conn, fromServer bool) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromServer && p.cut(buf[:n]) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
