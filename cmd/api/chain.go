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
// Alchemy's removed as a reason to ask) on the networks' RPCs; nil
// without any.
// The api has no alert webhook: what the breaker says is logged.
func openChain(runCtx, ctx context.Context, settings settings, db *postgres.DB, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) (httpapi.Chain, func(), error) {
	s := settings.chain
	if !s.HasRPC() {
		return nil, func() {}, nil
	}
	assets, err := db.Assets(ctx)
	if err != nil {
		return nil, nil, err
	}
	go db.KeepRegistry(runCtx, assets, settings.registryRefresh, func(err error) {
		log.Warn().Err(err).Msg("registry reload failed; keeping the networks and assets read before")
	})
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
