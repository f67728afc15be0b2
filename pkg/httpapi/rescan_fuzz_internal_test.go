package httpapi

import (
	"strings"
	"testing"
	"unicode/utf8"

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

// FuzzRescanCancelBody: whatever the body, parseRescanCancel never
// panics, and what it accepts names an operator and a reason, both
// non-blank, printable and within their bounds.
func FuzzRescanCancelBody(f *testing.F) {
	for _, seed := range []string{
		`{"operator":"bob","reason":"typo: block 3,000,000 meant"}`,
		`{"operator":"bob"}`,
		`{"operator":" ","reason":"typo"}`,
		`{"operator":"a\nb","reason":"typo"}`,
		`{"operator":"bob","reason":"typo","reason":"again"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		operator, reason, err := parseRescanCancel(body)
		if err != nil {
			return
		}
		for _, s := range []struct {
			value string
			max   int
		}{{operator, operatorLengthMax}, {reason, cancelReasonLengthMax}} {
			if strings.TrimSpace(s.value) != s.value || s.value == "" || !printable(s.value) || utf8.RuneCountInString(s.value) > s.max {
				t.Fatalf("accepted %q as operator %q, reason %q", body, operator, reason)
			}
		}
	})
}
