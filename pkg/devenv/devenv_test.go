package devenv

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// A port something else answers on is refused, named, before a server is
// started there: the server would exit at once, and the wait for its port
// would take the other server for it (seen: `task run` on a machine with
// another PostgreSQL on 55432 ran the dev stack on that database).
func TestServersRefuseATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if r, err := StartRedis(ctx, RedisOptions{Port: port}); !errors.Is(err, ErrPortTaken) {
		if r != nil {
			r.Close()
		}
		t.Fatalf("Redis on a taken port: %v, want ErrPortTaken", err)
	}
	if _, err := PostgresBinDir(); err != nil {
		t.Fatalf("PostgreSQL's binaries: %v", err)
	}
	p, err := StartPostgres(ctx, PostgresOptions{Port: port})
	if !errors.Is(err, ErrPortTaken) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("PostgreSQL on a taken port: %v, want ErrPortTaken", err)
	}
	if !strings.Contains(err.Error(), "127.0.0.1:") {
		t.Fatalf("the error names no address: %v", err)
	}
}
