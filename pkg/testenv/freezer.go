package testenv

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Freezer is a TCP proxy in front of PostgreSQL. Frozen, it keeps every
// connection open and passes no byte either way, and accepts new ones
// that get no answer: a host that vanished without a reset (a failover,
// a partition, a paused VM), which the client's kernel does not notice
// for many minutes.
type Freezer struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

// NewFreezer starts a freezer in front of dsn's server (a URL) and
// returns it with dsn pointed at it; it stops when t ends. A test that
// freezes defers Thaw: a pool opened after the freezer closes first, and
// waits for the calls the freeze holds.
func NewFreezer(t testing.TB, dsn string) (*Freezer, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("freezer: %q is not a URL with a host", dsn)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("freezer: %v", err)
	}
	f := &Freezer{ln: ln}
	target := u.Host
	t.Cleanup(func() {
		f.Thaw() // the held bytes go, so the pipes see the closed ends
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			_ = c.Close()
		}
		f.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			go f.pipe(c, up)
			go f.pipe(up, c)
		}
	}()
	u.Host = ln.Addr().String()
	return f, u.String()
}

// Freeze stops every byte until Thaw.
func (f *Freezer) Freeze() { f.frozen.Store(true) }

// Thaw lets the bytes through again, the held ones first.
func (f *Freezer) Thaw() { f.frozen.Store(false) }

func (f *Freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			_ = dst.Close()
			return
		}
		for f.frozen.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}
