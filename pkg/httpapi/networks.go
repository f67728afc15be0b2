package httpapi

import "github.com/settle/settle/pkg/payment"

func enabledNetworks(names []string) map[string]bool {
	if len(names) == 0 {
		names = []string{payment.DefaultNetwork}
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}

// networkEnabled tells whether events on network are settled here
// (NETWORKS): another network's event is a 400 at /webhook/payments and an
// ignored, counted transfer at a provider's route.
func (s *Server) networkEnabled(network string) bool { return s.networks[network] }
