package main

import (
	"context"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/task"
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

// recheckQueue hands rechecks to the workers: a task on the maintenance
// queue, then a wake-up for idle workers (a lost one costs the task a
// few seconds of their poll, never the task).
type recheckQueue struct {
	client *asynq.Client
	redis  redis.UniversalClient
}

func (q recheckQueue) Enqueue(ctx context.Context, id string, r task.RecheckTask) error {
	t, opts, err := task.NewRecheckTask(id, r)
	if err != nil {
		return err
	}
	if _, err := q.client.EnqueueContext(ctx, t, opts...); err != nil {
		return err
	}
	_ = outbox.PublishQueueWake(ctx, q.redis, task.QueueMaintenance)
	return nil
}
