package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/queue"
)

type chainSettings struct {
	Policy          chain.Policy
	RPCURL          string
	FinalityTimeout time.Duration
	RecheckFirst    time.Duration
	RecheckMax      time.Duration
	CallTimeout     time.Duration
	// HintTTL is how long "not final yet" is believed without asking the
	// chain again.
	HintTTL time.Duration
	// ReorgRecheckDelay: two reads of a credited deposit's missing receipt
	// at least this far apart (and a block apart) are evidence of a reorg.
	ReorgRecheckDelay time.Duration
	Breaker           chain.BreakerSettings
}

func readChainSettings(env *config.Env) chainSettings {
	s := chainSettings{
		Policy:            config.Parse(env, "DEPOSIT_FINALITY", chain.FinalizedPolicy(), chain.ParsePolicy),
		RPCURL:            env.URL("ETH_RPC_URL", "", "http", "https"),
		FinalityTimeout:   env.Duration("FINALITY_TIMEOUT", finality.TimeoutDefault),
		RecheckFirst:      env.Duration("FINALITY_RECHECK_MIN", finality.RecheckFirstDefault),
		RecheckMax:        env.Duration("FINALITY_RECHECK_MAX", finality.RecheckMaxDefault),
		CallTimeout:       env.Duration("ETH_RPC_TIMEOUT", chain.CallTimeoutDefault),
		HintTTL:           env.Duration("FINALITY_HINT_TTL", chain.NotFinalTTLDefault),
		ReorgRecheckDelay: env.Duration("REORG_RECHECK_DELAY", finality.ReorgRecheckDelayDefault),
		Breaker: chain.BreakerSettings{
			ErrorsMax:   env.Int("ETH_RPC_BREAKER_ERRORS", chain.BreakerErrorsMaxDefault, 1, 1000),
			ErrorWindow: env.Duration("ETH_RPC_BREAKER_WINDOW", chain.BreakerErrorWindowDefault),
			OpenFor:     env.Duration("ETH_RPC_BREAKER_OPEN_FOR", chain.BreakerOpenForDefault),
		},
	}
	if s.RPCURL == "" && s.Policy.Kind() != chain.None {
		env.Reject("ETH_RPC_URL", fmt.Errorf("required when DEPOSIT_FINALITY is %s", s.Policy))
	}
	return s
}

// newGate builds the finality gate; without an RPC endpoint (policy none)
// deposits with a tx hash are trusted and there is no gate.
func newGate(ctx context.Context, s chainSettings, db *postgres.DB, rdb redis.UniversalClient, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) (queue.Gate, func(), error) {
	if s.RPCURL == "" {
		return nil, func() {}, nil
	}
	client, err := chain.Dial(ctx, s.RPCURL, chain.ClientOptions{
		Redis: rdb, Registerer: reg, Alerter: alerts, Logger: log, CallTimeout: s.CallTimeout, Breaker: s.Breaker,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ETH_RPC_URL: %w", err)
	}
	registry, err := db.Assets(ctx)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	gate := finality.New(finality.Options{
		Store: db, Chain: chain.NewChecker(client, chain.CheckerOptions{Redis: rdb, Registerer: reg, NotFinalTTL: s.HintTTL}),
		Assets: registry, Policy: s.Policy, Timeout: s.FinalityTimeout,
		RecheckFirst: s.RecheckFirst, RecheckMax: s.RecheckMax, ReorgRecheckDelay: s.ReorgRecheckDelay,
		Alerts: alerts, Log: log, Registerer: reg,
	})
	return gate, client.Close, nil
}

// newNotifier delivers the notification outbox when NOTIFY_WEBHOOK_URL is
// set; without it the ledger writes no notifications at all.
func newNotifier(url string, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) func(context.Context) error {
	if url == "" {
		return nil
	}
	return notify.New(db, url, log, alerts, reg).Deliver
}
