package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// SilentServer accepts every connection and never answers: a database
// still starting, or a pooler waiting for one. A process that connects
// to it has set up its signal handling (service.Main does so first), so a
// test signals it once Connected grows, not after a guessed sleep, which
// a loaded machine's race binary can outlast.
type SilentServer struct {
	Port      int
	ln        net.Listener
	connected atomic.Int64
	mu        sync.Mutex
	held      []net.Conn
}

// NewSilentServer listens on a free local port until t ends.
func NewSilentServer(t testing.TB) *SilentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("silent server: %v", err)
	}
	s := &SilentServer{Port: ln.Addr().(*net.TCPAddr).Port, ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.held = append(s.held, c)
			s.mu.Unlock()
			s.connected.Add(1)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.held {
			_ = c.Close()
		}
	})
	return s
}

// Connected counts the connections accepted so far.
func (s *SilentServer) Connected() int64 { return s.connected.Load() }

// AwaitConnection waits up to a minute for a connection beyond the first
// after, failing t if the process (its Wait's answer on exited) ends
// first; output describes it in the failure.
func (s *SilentServer) AwaitConnection(t testing.TB, after int64, exited <-chan error, output func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.connected.Load() <= after {
		select {
		case err := <-exited:
			t.Fatalf("exited before it connected to the database (%v):\n%s", err, output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("never connected to the database in a minute:\n%s", output())
		}
	}
}
