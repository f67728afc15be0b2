package httpapi

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzClientIP: X-Forwarded-For is written by whoever sends the request,
// and the address it yields keys the rate limit. Whatever it says, the
// client is the TCP peer unless the peer is a trusted proxy, and
// otherwise the peer or one of the header's own hops: never an address
// the request did not carry.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.0/8", "10.1.2.3:443", "203.0.113.7, 10.0.0.2")
	f.Add("", "198.51.100.1:1234", "203.0.113.7")
	f.Add("10.0.0.1,::1", "[::1]:80", "garbage, 2001:db8::1 ,10.0.0.1")
	f.Add("10.0.0.0/8", "10.1.2.3:443", strings.Repeat("10.0.0.9,", 40))
	f.Fuzz(func(t *testing.T, proxies, remote, forwarded string) {
		trusted, err := ParseTrustedProxies(proxies)
		if err != nil {
			return
		}
		r, err := http.NewRequest(http.MethodGet, "http://settle.test/", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", forwarded)
		got := trusted.ClientIP(r)
		peer := parseHost(remote)
		if got == peer {
			return
		}
		if len(trusted) == 0 || !trusted.trusts(peer) {
			t.Fatalf("untrusted peer %v, yet the client is %v", peer, got)
		}
		for _, hop := range strings.Split(forwarded, ",") {
			if parseHost(strings.TrimSpace(hop)) == got {
				return
			}
		}
		t.Fatalf("client %v is neither the peer %v nor a hop of %q", got, peer, forwarded)
	})
}
