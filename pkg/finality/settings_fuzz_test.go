package finality_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
)

// FuzzReadSettings: whatever an operator writes in the chain settings,
// they are either refused, naming the setting and never quoting an RPC
// URL's secret part, or read into settings a binary can run with: named
// networks, each once and at most NetworksMax, a valid policy each,
// positive durations, bounded breaker counts and http(s) RPC URLs.
func FuzzReadSettings(f *testing.F) {
	f.Add("ETH_MAINNET,BASE_MAINNET", "finalized", "confirmations:12", "1h", "5", "https://eth.example")
	f.Add(" ETH_MAINNET , ETH_MAINNET,", "none", "safe", "-1s", "0", "ftp://x")
	f.Add("eth_mainnet", "confirmations:0", "", "1", "1001", "https://")
	f.Add(strings.Repeat("A,", 70), "latest", "confirmations:x", "10m", "7", "http://[::1]:8545")
	f.Fuzz(func(t *testing.T, networks, policy, basePolicy, timeout, breakerErrors, rpcURL string) {
		const secret = "k3y-0f-th3-rpc-s3cr3t"
		rpc := rpcURL + "/" + secret
		env := config.FromMap(map[string]string{
			"NETWORKS": networks, "DEPOSIT_FINALITY_BASE_MAINNET": policy, "DEPOSIT_FINALITY": basePolicy,
			"FINALITY_TIMEOUT": timeout, "ETH_RPC_BREAKER_ERRORS": breakerErrors, "ETH_RPC_URL": rpc,
		})
		s := finality.ReadSettings(env, false)
		if err := env.Err(); err != nil {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the refusal quotes the RPC URL: %v", err)
			}
			return
		}
		if len(s.Networks) == 0 || len(s.Networks) > finality.NetworksMax {
			t.Fatalf("%d networks from %q", len(s.Networks), networks)
		}
		var names []string
		for _, n := range s.Networks {
			if !networkName.MatchString(n.Name) || slices.Contains(names, n.Name) {
				t.Fatalf("network %q from %q", n.Name, networks)
			}
			names = append(names, n.Name)
			if !n.Policy.Valid() {
				t.Fatalf("policy %v of %s", n.Policy, n.Name)
			}
			if n.RPCURL != "" && !strings.HasPrefix(n.RPCURL, "http://") && !strings.HasPrefix(n.RPCURL, "https://") {
				t.Fatalf("RPC URL %q of %s", n.RPCURL, n.Name)
			}
		}
		if s.FinalityTimeout <= 0 || s.Breaker.ErrorsMax < 1 || s.Breaker.ErrorsMax > 1000 {
			t.Fatalf("timeout %v, breaker errors %d", s.FinalityTimeout, s.Breaker.ErrorsMax)
		}
	})
}

var networkName = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)
