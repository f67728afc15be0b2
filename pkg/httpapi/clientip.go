package httpapi

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Bounds on the proxy settings and on what a request may claim.
const (
	trustedProxiesMax = 256
	// forwardedHopsMax bounds how far back X-Forwarded-For is walked.
	forwardedHopsMax = 32
)

// TrustedProxies are the peers whose X-Forwarded-For is believed
// (TRUSTED_PROXIES: comma-separated CIDRs or addresses).
//
// Why: the rate limit is per client address, and X-Forwarded-For is
// written by whoever sends the request. Believing it from anyone would let
// a client pick a fresh address per request and escape the limit. So by
// default nothing is trusted and the client is the TCP peer. Behind a load
// balancer, list its addresses: the header is then read from the right,
// skipping trusted hops, and the first address that is not a trusted proxy
// is the client (entries further left were written by the client itself
// and are ignored).
type TrustedProxies []netip.Prefix

// ParseTrustedProxies reads TRUSTED_PROXIES; empty means none.
func ParseTrustedProxies(s string) (TrustedProxies, error) {
	var out TrustedProxies
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if len(out) == trustedProxiesMax {
			return nil, fmt.Errorf("more than %d entries", trustedProxiesMax)
		}
		if strings.Contains(item, "/") {
			prefix, err := netip.ParsePrefix(item)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR like 10.0.0.0/8", item)
			}
			out = append(out, prefix.Masked())
			continue
		}
		addr, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address or CIDR", item)
		}
		addr = addr.Unmap()
		out = append(out, netip.PrefixFrom(addr, addr.BitLen()))
	}
	return out, nil
}

func (t TrustedProxies) trusts(addr netip.Addr) bool {
	for _, p := range t {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// ClientIP decides the client's address for r.
func (t TrustedProxies) ClientIP(r *http.Request) netip.Addr {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() || !t.trusts(peer) {
		return peer
	}
	var hops []string
	for _, header := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(header, ",")...)
	}
	client := peer
	for i, seen := len(hops)-1, 0; i >= 0 && seen < forwardedHopsMax; i, seen = i-1, seen+1 {
		hop := parseHost(strings.TrimSpace(hops[i]))
		if !hop.IsValid() {
			// A garbled entry ends the walk: everything left of it is
			// unverifiable; the last good hop stands.
			return client
		}
		client = hop
		if !t.trusts(hop) {
			return hop
		}
	}
	return client
}

// parseHost reads "ip", "ip:port" or "[ipv6]:port".
func parseHost(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if addr, err := netip.ParseAddr(s); err == nil {
		return addr.Unmap()
	}
	return netip.Addr{}
}
