package chaos

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proxy bounds.
const (
	// proxyChunkMax is the most one read takes off a socket.
	proxyChunkMax = 32 << 10
	// proxyQueueMax bounds the chunks waiting out their latency on one
	// direction of one connection; a full queue stops reading, as a full
	// TCP window would.
	proxyQueueMax = 64
	// proxyDialTimeout bounds the connection to the upstream server.
	proxyDialTimeout = 2 * time.Second
	// proxyLatencyMax caps injected latency, whatever the caller asks.
	proxyLatencyMax = 2 * time.Second
)

// proxy is a TCP relay between settle's processes and PostgreSQL or
// Redis. It sits on the path so that the soak can do to the network what
// the network does in production: add latency to every packet of a
// connection, tear every connection down with a RST, or swallow traffic
// for a while (a partition), after which queued bytes flow again, as TCP
// retransmission would deliver them.
type proxy struct {
	name     string
	upstream string
	listener net.Listener

	mu        sync.Mutex
	conns     map[*relay]struct{}
	latency   time.Duration
	blackhole chan struct{} // non-nil while traffic is swallowed; closed when it heals
	rng       *rand.Rand    // per-connection latency shares; guarded by mu
	closed    bool
	accepted  int
	resets    int

	wg sync.WaitGroup
}

// relay is one client connection and its upstream twin.
type relay struct {
	client, server net.Conn
	// share scales the injected latency for this connection, so that
	// connections under one fault see different delays and their replies
	// overtake each other.
	share float64
	once  sync.Once
	done  chan struct{}
}

// newProxy listens on a free loopback port and relays to upstream.
func newProxy(t testing.TB, name, upstream string, seed uint64) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy %s: %v", name, err)
	}
	p := &proxy{
		name: name, upstream: upstream, listener: l,
		conns: map[*relay]struct{}{},
		rng:   rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is where clients connect.
func (p *proxy) Addr() string { return p.listener.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.listener.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		r := &relay{client: c, share: 0.5 + p.rng.Float64(), done: make(chan struct{})}
		p.conns[r] = struct{}{}
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(r)
	}
}

func (p *proxy) serve(r *relay) {
	defer p.wg.Done()
	// A partitioned host accepts nothing: the connection waits (its client
	// times out on its own) until the partition heals or is reset.
	if !p.passable(r) {
		p.drop(r, true)
		return
	}
	server, err := net.DialTimeout("tcp", p.upstream, proxyDialTimeout)
	if err != nil {
		// The server is down: refuse the client the way the server would.
		p.drop(r, true)
		return
	}
	p.mu.Lock()
	r.server = server
	gone := isClosed(r.done)
	p.mu.Unlock()
	if gone {
		// Reset while dialing.
		abort(server)
		return
	}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(r, r.client, server) }()
	go func() { defer pumps.Done(); p.pump(r, server, r.client) }()
	pumps.Wait()
}

type chunk struct {
	data []byte
	due  time.Time
}

// pump copies src to dst: a reader stamps each chunk with its due time
// (now + this connection's latency), a writer delivers it then. Order is
// kept; latency adds to every chunk without capping throughput.
func (p *proxy) pump(r *relay, src, dst net.Conn) {
	queue := make(chan chunk, proxyQueueMax)
	go func() {
		defer close(queue)
		buf := make([]byte, proxyChunkMax)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.delay(r))}
				select {
				case queue <- c:
				case <-r.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			select {
			case <-time.After(wait):
			case <-r.done:
				return
			}
		}
		if !p.passable(r) {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// One side finished (EOF or error): settle's clients never half-close,
	// so the whole relay goes, politely.
	p.drop(r, false)
}

// passable waits out a blackhole; false if the relay was reset meanwhile.
func (p *proxy) passable(r *relay) bool {
	for {
		p.mu.Lock()
		hole := p.blackhole
		p.mu.Unlock()
		if hole == nil {
			return !isClosed(r.done)
		}
		select {
		case <-hole:
		case <-r.done:
			return false
		}
	}
}

func (p *proxy) delay(r *relay) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Duration(float64(p.latency) * r.share)
}

// drop ends a relay; hard sends RST instead of FIN on both sides.
func (p *proxy) drop(r *relay, hard bool) {
	p.mu.Lock()
	delete(p.conns, r)
	server := r.server
	p.mu.Unlock()
	r.once.Do(func() {
		close(r.done)
		if hard {
			abort(r.client)
			if server != nil {
				abort(server)
			}
			return
		}
		r.client.Close()
		if server != nil {
			server.Close()
		}
	})
}

// abort closes with SO_LINGER 0, so the peer gets a RST: "connection
// reset by peer" rather than a clean end of stream.
func abort(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	c.Close()
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// SetLatency makes every chunk on every connection, current and new,
// wait latency (times the connection's share, 0.5–1.5); zero heals.
func (p *proxy) SetLatency(latency time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = min(max(latency, 0), proxyLatencyMax)
}

// ResetAll tears down every current connection with a RST and reports
// how many there were.
func (p *proxy) ResetAll() int {
	p.mu.Lock()
	relays := make([]*relay, 0, len(p.conns))
	for r := range p.conns {
		relays = append(relays, r)
	}
	p.resets += len(relays)
	p.mu.Unlock()
	for _, r := range relays {
		p.drop(r, true)
	}
	return len(relays)
}

// Blackhole swallows traffic until Heal: nothing is forwarded and new
// connections get no answer.
func (p *proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole == nil {
		p.blackhole = make(chan struct{})
	}
}

// Heal ends a blackhole and any latency.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole != nil {
		close(p.blackhole)
		p.blackhole = nil
	}
	p.latency = 0
}

// Stats counts connections accepted and reset so far.
func (p *proxy) Stats() (accepted, reset int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.resets
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.listener.Close()
	p.Heal()
	p.ResetAll()
	p.wg.Wait()
}

// TestProxy checks the relay itself against an echo server: bytes pass
// unchanged, latency delays them, a blackhole holds them until it heals,
// and a reset reaches the client as an error.
func TestProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p := newProxy(t, "echo", echo.Addr().String(), 1)
	roundTrip := func(c net.Conn, msg []byte) ([]byte, error) {
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		got := make([]byte, len(msg))
		_, err := io.ReadFull(c, got)
		return got, err
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := bytes.Repeat([]byte("settle"), 20_000) // several chunks
	if got, err := roundTrip(c, msg); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("plain relay: %v", err)
	}

	p.SetLatency(200 * time.Millisecond)
	started := time.Now()
	if _, err := roundTrip(c, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	// Two crossings at no less than half the latency each.
	if took := time.Since(started); took < 200*time.Millisecond {
		t.Fatalf("latency not applied: round trip took %s", took)
	}
	p.Heal()

	p.Blackhole()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := roundTrip(c, []byte("lost?")); err == nil {
		t.Fatal("an answer came through the blackhole")
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len("lost?"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "lost?" {
		t.Fatalf("bytes held by the blackhole not delivered after healing: %q %v", got, err)
	}

	if n := p.ResetAll(); n != 1 {
		t.Fatalf("reset %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after reset: %v, want connection reset", err)
	}
}
