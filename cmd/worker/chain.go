package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/queue"
)

// newGate builds the finality gate; without an RPC endpoint (policy none)
// deposits with a tx hash are trusted and there is no gate.
func newGate(ctx context.Context, s finality.Settings, db *postgres.DB, rdb redis.UniversalClient, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) (queue.Gate, func(), error) {
	if !s.HasRPC() {
		return nil, func() {}, nil
	}
	registry, err := db.Assets(ctx)
	if err != nil {
		return nil, nil, err
	}
	gate, closeGate, err := finality.Open(ctx, s, finality.Deps{
		Store: db, Assets: registry, Redis: rdb, Alerts: alerts, Log: log, Registerer: reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return gate, closeGate, nil
}

// newNotifier delivers the notification outbox when NOTIFY_WEBHOOK_URL is
// set; without it the ledger writes no notifications at all.
func newNotifier(url string, key []byte, db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer) func(context.Context) error {
	if url == "" {
		return nil
	}
	return notify.New(db, url, key, log, alerts, reg).Deliver
}
