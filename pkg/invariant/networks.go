package invariant

import (
	"fmt"
	"strings"

	"github.com/settle/settle/pkg/postgres"
)

// writeNetworkFlows prints an asset's credits and debits per network
// under its conservation line. They are a report, not an invariant: a
// balance is one per asset, and USDC deposited on Base may leave on
// Ethereum, so a network's net may be anything.
func writeNetworkFlows(b *strings.Builder, c postgres.Conservation) {
	for _, f := range c.Networks {
		fmt.Fprintf(b, "       %s on %s: credits %s - debits %s = net %s\n", c.Asset, f.Network, f.Credits, f.Debits, f.Net())
	}
}

func networkFlowsJSON(c postgres.Conservation) []map[string]any {
	out := make([]map[string]any, 0, len(c.Networks))
	for _, f := range c.Networks {
		out = append(out, map[string]any{
			"network": f.Network, "credits": f.Credits.String(), "debits": f.Debits.String(), "net": f.Net().String(),
		})
	}
	return out
}
