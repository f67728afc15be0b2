package httpapi

import (
	"testing"

	"github.com/settle/settle/pkg/alchemy"
)

// FuzzRescanBody: whatever the body, parseRescan never panics, and what
// it accepts is a valid network and a range of at most blocksMax blocks
// in order.
func FuzzRescanBody(f *testing.F) {
	for _, seed := range []string{
		`{"network":"ETH_MAINNET","from_block":0,"to_block":99999}`,
		`{"network":"ETH_MAINNET","from_block":10,"to_block":9}`,
		`{"network":"ETH_MAINNET","from_block":-1,"to_block":9}`,
		`{"network":"ETH_MAINNET","from_block":1e3,"to_block":2000}`,
		`{"network":"ETH_MAINNET","from_block":4611686018427387904,"to_block":4611686018427387904}`,
	} {
		f.Add([]byte(seed))
	}
	const blocksMax = RescanBlocksMaxDefault
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseRescan(body, blocksMax)
		if err != nil {
			return
		}
		if !alchemy.ValidNetwork(r.network) || r.to < r.from || r.to-r.from >= blocksMax || r.to > blockNumberMax {
			t.Fatalf("accepted %q as %+v", body, r)
		}
	})
}
