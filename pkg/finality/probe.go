package finality

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/chain"
)

// TraceProbe tells at start, network by network, whether the RPC serves
// what INTERNAL_TRANSFER_CHECK=trace needs (debug_traceTransaction), so
// that an operator learns it before the first internal deposit waits.
// It never stops the worker: a deployment that sees no internal deposit
// runs without the debug API.
type TraceProbe struct {
	untraceable *prometheus.GaugeVec
	log         zerolog.Logger
	timeout     time.Duration
}

// NewTraceProbe registers settle_internal_transfer_check_untraceable on
// reg (nil: none); timeout bounds each network's probe.
func NewTraceProbe(reg prometheus.Registerer, timeout time.Duration, log zerolog.Logger) *TraceProbe {
	p := &TraceProbe{
		untraceable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "settle_internal_transfer_check_untraceable",
			Help: "1 when the network's internal transfers are checked against their trace (INTERNAL_TRANSFER_CHECK=trace) and its RPC does not serve debug_traceTransaction: internal deposits there wait. Absent until the RPC has answered the probe.",
		}, []string{"network"}),
		log:     log,
		timeout: timeout,
	}
	if reg != nil {
		reg.MustRegister(p.untraceable)
	}
	return p
}

// Run probes every network with a client, then again every `every` the
// ones whose RPC could not be asked (down at start), until each has
// answered or ctx ends.
func (p *TraceProbe) Run(ctx context.Context, s Settings, clients Clients, every time.Duration) {
	pending := p.Probe(ctx, s, clients, nil)
	if len(pending) == 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pending = p.Probe(ctx, s, clients, pending)
	}
}

// Probe asks the networks named in only (nil: every one) that have a
// client, and returns the ones it could not ask.
func (p *TraceProbe) Probe(ctx context.Context, s Settings, clients Clients, only []string) (unasked []string) {
	for _, n := range s.networks() {
		client, ok := clients[n.Name]
		if !ok || (only != nil && !slices.Contains(only, n.Name)) {
			continue
		}
		if n.InternalStatusOnly {
			p.untraceable.WithLabelValues(n.Name).Set(0) // no trace is asked for
			continue
		}
		probeCtx, cancel := context.WithTimeout(ctx, p.timeout)
		err := client.ProbeTxTraces(probeCtx)
		cancel()
		switch {
		case errors.Is(err, chain.ErrTxTraceUnsupported):
			p.untraceable.WithLabelValues(n.Name).Set(1)
			p.log.Warn().Str("network", n.Name).Str("setting", InternalCheckSetting(n.Name)).
				Msgf("%s's RPC does not serve debug_traceTransaction: its internal deposits (trace:) will wait, alerted, never credited; "+
					"give %s an endpoint with the debug API, or set %s=status to credit them on the provider's word",
					n.Name, rpcSettingOf(n.Name), InternalCheckSetting(n.Name))
		case err != nil:
			unasked = append(unasked, n.Name)
			p.log.Warn().Err(err).Str("network", n.Name).
				Msg("could not ask the RPC whether it serves debug_traceTransaction, which internal deposits need; asked again later")
		default:
			p.untraceable.WithLabelValues(n.Name).Set(0)
		}
	}
	return unasked
}
