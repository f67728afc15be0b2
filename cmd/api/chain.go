package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
)

// openChain builds the api's view of the chain (the recheck, and with it
// Alchemy's removed as a reason to ask) on ETH_RPC_URL; nil without one.
// The api has no alert webhook: what the breaker says is logged.
func openChain(ctx context.Context, s finality.Settings, db *postgres.DB, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) (httpapi.Chain, func(), error) {
	if !s.HasRPC() {
		return nil, func() {}, nil
	}
	assets, err := db.Assets(ctx)
	if err != nil {
		return nil, nil, err
	}
	alerts := alert.New(log, alert.Options{Service: serviceName, Registerer: reg})
	rechecker, closeChain, err := finality.OpenRechecker(ctx, s, finality.Deps{
		Store: db, Assets: assets, Redis: rdb, Alerts: alerts, Log: log, Registerer: reg,
	}, db)
	if err != nil {
		alerts.Close()
		return nil, nil, err
	}
	return rechecker, func() { closeChain(); alerts.Close() }, nil
}
