package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/payment"
)

// The admin registry bodies are outside input: whatever they hold, a
// parse either refuses with a 400 or yields an addition the tables'
// CHECKs accept (names and codes by their patterns, a chain id above
// zero, a lowercase contract, decimals 0..18).
func FuzzAdminRegistryBodies(f *testing.F) {
	for _, seed := range []string{
		`{"name":"DEVNET","chain_id":31337,"native":"DEV","decimals":18}`,
		`{"name":"devnet","chain_id":0,"native":"DEV","decimals":19}`,
		`{"network":"BASE_MAINNET","asset":"NEWT","contract":"0x5FbDB2315678afecb367f032d93F642f64180aa3","decimals":6}`,
		`{"network":"BASE_MAINNET","asset":"ETH","contract":null,"decimals":0}`,
		`{"network":"X","asset":"Y","contract":"","decimals":-0}`,
		`{"name":"A","chain_id":9223372036854775808,"native":"B","decimals":1e1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := decodeObject(body)
		if err != nil {
			return
		}
		if n, answer := parseNetworkFields(fields); answer != nil {
			requireBadRequest(t, answer)
		} else if payment.CheckNetwork(n.Name, n.ChainID, n.Native, int64(n.Decimals)) != nil {
			t.Fatalf("accepted an invalid network %+v from %q", n, body)
		}
		a, answer := parseListingFields(fields)
		if answer != nil {
			requireBadRequest(t, answer)
			return
		}
		again, err := payment.CheckListing(a.Network, a.Code, a.Contract, int64(a.Decimals))
		if err != nil || again != a {
			t.Fatalf("accepted an invalid listing %+v from %q: %v", a, body, err)
		}
		if a.Contract != strings.ToLower(a.Contract) {
			t.Fatalf("contract %q not lowercased", a.Contract)
		}
	})
}

func requireBadRequest(t *testing.T, answer *apiError) {
	t.Helper()
	if answer.status != http.StatusBadRequest || answer.class().code != CodeInvalidRequest {
		t.Fatalf("refusal %d %s, want 400 invalid_request", answer.status, answer.class().code)
	}
}
