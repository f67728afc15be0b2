package finality

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/payment"
)

// Settings are the chain settings of every binary that asks the chain
// (the worker's gate, the api's and settlectl's recheck), parsed the same
// way with the same defaults for each.
type Settings struct {
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

// ReadSettings reads the chain settings. rpcRequired is the worker's
// rule: a policy other than none needs ETH_RPC_URL there, while the api
// and settlectl run without one (they only cannot ask the chain).
func ReadSettings(env *config.Env, rpcRequired bool) Settings {
	s := Settings{
		Policy:            config.Parse(env, "DEPOSIT_FINALITY", chain.FinalizedPolicy(), chain.ParsePolicy),
		RPCURL:            env.URL("ETH_RPC_URL", "", "http", "https"),
		FinalityTimeout:   env.Duration("FINALITY_TIMEOUT", TimeoutDefault),
		RecheckFirst:      env.Duration("FINALITY_RECHECK_MIN", RecheckFirstDefault),
		RecheckMax:        env.Duration("FINALITY_RECHECK_MAX", RecheckMaxDefault),
		CallTimeout:       env.Duration("ETH_RPC_TIMEOUT", chain.CallTimeoutDefault),
		HintTTL:           env.Duration("FINALITY_HINT_TTL", chain.NotFinalTTLDefault),
		ReorgRecheckDelay: env.Duration("REORG_RECHECK_DELAY", ReorgRecheckDelayDefault),
		Breaker: chain.BreakerSettings{
			ErrorsMax:   env.Int("ETH_RPC_BREAKER_ERRORS", chain.BreakerErrorsMaxDefault, 1, 1000),
			ErrorWindow: env.Duration("ETH_RPC_BREAKER_WINDOW", chain.BreakerErrorWindowDefault),
			OpenFor:     env.Duration("ETH_RPC_BREAKER_OPEN_FOR", chain.BreakerOpenForDefault),
		},
	}
	if rpcRequired && s.RPCURL == "" && s.Policy.Kind() != chain.None {
		env.Reject("ETH_RPC_URL", fmt.Errorf("required when DEPOSIT_FINALITY is %s", s.Policy))
	}
	return s
}

// HasRPC tells whether the chain can be asked.
func (s Settings) HasRPC() bool { return s.RPCURL != "" }

// Deps are what Open builds a gate on.
type Deps struct {
	Store  Store
	Assets *payment.Registry
	// Redis shares the breaker's state and the finality cache across
	// processes; nil keeps both in-process.
	Redis      redis.UniversalClient
	Alerts     Alerter
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Open dials ETH_RPC_URL and builds the gate on it; without an RPC
// endpoint there is no gate (nil). The returned function releases the
// client.
func Open(ctx context.Context, s Settings, d Deps) (*Gate, func(), error) {
	if !s.HasRPC() {
		return nil, func() {}, nil
	}
	client, err := chain.Dial(ctx, s.RPCURL, chain.ClientOptions{
		Redis: d.Redis, Registerer: d.Registerer, Alerter: d.Alerts, Logger: d.Log, CallTimeout: s.CallTimeout, Breaker: s.Breaker,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ETH_RPC_URL: %w", err)
	}
	gate := New(Options{
		Store: d.Store, Chain: chain.NewChecker(client, chain.CheckerOptions{Redis: d.Redis, Registerer: d.Registerer, NotFinalTTL: s.HintTTL}),
		Assets: d.Assets, Policy: s.Policy, Timeout: s.FinalityTimeout,
		RecheckFirst: s.RecheckFirst, RecheckMax: s.RecheckMax, ReorgRecheckDelay: s.ReorgRecheckDelay,
		Alerts: d.Alerts, Log: d.Log, Registerer: d.Registerer,
	})
	return gate, client.Close, nil
}
