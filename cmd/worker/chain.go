package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/worker"
)

// chainIDRecheckEvery is how often an RPC endpoint that could not be asked
// for its chain id at start is asked again.
const chainIDRecheckEvery = 30 * time.Second

// newGate builds the finality gate on the enabled networks' RPCs, after
// checking that each serves its network's chain. Without any RPC there is
// a gate all the same: deposits on a network enabled under policy none
// pass it unchecked, and those on any other network (taken out of
// NETWORKS while they waited) wait for an operator, never credited
// unasked. wrongChain receives a mismatch found after start, on an
// endpoint that was down then.
func newGate(ctx context.Context, s finality.Settings, db *postgres.DB, registry *payment.Registry, rdb redis.UniversalClient,
	alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer, wrongChain func(error)) (worker.Gate, func(), error) {
	deps := finality.Deps{Store: db, Assets: registry, Redis: rdb, Alerts: alerts, Log: log, Registerer: reg}
	if !s.HasRPC() {
		return finality.NewOnClients(s, deps, nil), func() {}, nil
	}
	clients, err := finality.Dial(ctx, s, deps)
	if err != nil {
		return nil, nil, err
	}
	checkCtx, cancel := context.WithTimeout(ctx, s.CallTimeout+time.Second)
	unreachable, err := finality.CheckChainIDs(checkCtx, clients, registry)
	cancel()
	if err != nil {
		clients.Close()
		return nil, nil, err
	}
	if len(unreachable) > 0 {
		log.Warn().Strs("networks", unreachable).Msg("rpc endpoints unreachable at start; their chain ids are checked once they answer")
		go recheckChainIDs(ctx, clients, registry, unreachable, log, wrongChain)
	}
	// Whether each endpoint serves what INTERNAL_TRANSFER_CHECK=trace
	// needs, told now rather than at the first internal deposit; never a
	// reason not to start, and a node down now is asked once it answers.
	probe := finality.NewTraceProbe(reg, s.CallTimeout+time.Second, log)
	probeCtx, stopProbe := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		probe.Run(probeCtx, s, clients, chainIDRecheckEvery)
	}()
	return finality.NewOnClients(s, deps, clients), func() {
		stopProbe()
		<-probed
		clients.Close()
	}, nil
}

// recheckChainIDs asks the endpoints that were down at start until each
// has answered.
func recheckChainIDs(ctx context.Context, clients finality.Clients, registry *payment.Registry, pending []string, log zerolog.Logger, wrongChain func(error)) {
	t := time.NewTicker(chainIDRecheckEvery)
	defer t.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		subset := finality.Clients{}
		for _, name := range pending {
			subset[name] = clients[name]
		}
		unreachable, err := finality.CheckChainIDs(ctx, subset, registry)
		if err != nil {
			wrongChain(err)
			return
		}
		if len(unreachable) < len(pending) {
			log.Info().Strs("still_unreachable", unreachable).Msg("rpc chain ids checked")
		}
		pending = unreachable
	}
}

// newNotifier delivers the notification outbox when NOTIFY_WEBHOOK_URL is
// set; without it the ledger writes no notifications at all.
func newNotifier(url string, key []byte, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) func(context.Context) error {
	if url == "" {
		return nil
	}
	return notify.New(db, url, key, log, alerts, reg).Deliver
}
