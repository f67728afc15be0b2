package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/queue"
)

type policy string

func (p policy) String() string { return string(p) }

type chainSettings struct {
	Policy          policy
	RPCURL          string
	FinalityTimeout time.Duration
}

func readChainSettings(env *config.Env) chainSettings {
	return chainSettings{
		Policy:          policy(env.String("DEPOSIT_FINALITY", "finalized")),
		RPCURL:          env.String("ETH_RPC_URL", ""),
		FinalityTimeout: env.Duration("FINALITY_TIMEOUT", time.Hour),
	}
}

func newGate(ctx context.Context, s chainSettings, db *postgres.DB, rdb redis.UniversalClient, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) (queue.Gate, func(), error) {
	if s.Policy == "none" && s.RPCURL == "" {
		return nil, func() {}, nil
	}
	return nil, func() {}, errors.New("chain gating is not wired yet")
}

// newNotifier delivers the notification outbox when NOTIFY_WEBHOOK_URL is
// set; without it the ledger writes no notifications at all.
func newNotifier(url string, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) func(context.Context) error {
	if url == "" {
		return nil
	}
	return notify.New(db, url, log, alerts, reg).Deliver
}
