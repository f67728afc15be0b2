package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/postgres"
)

// handoffSettings say when the api hands a commit's events to the queue
// itself (INGEST_HANDOFF_MAX; 0 leaves every event to the scheduler) and
// the scheduler's task size and queue bound it must keep to.
type handoffSettings struct {
	eventsMax  int
	taskEvents int
	depthMax   int
}

func readHandoff(env *config.Env) handoffSettings {
	h := handoffSettings{
		eventsMax:  env.Int("INGEST_HANDOFF_MAX", outbox.HandoffEventsMaxDefault, 0, postgres.TaskEventsMax),
		taskEvents: env.Int("TASK_EVENTS_MAX", outbox.TaskEventsDefault, 1, postgres.TaskEventsMax),
		depthMax:   env.Int("QUEUE_DEPTH_MAX", outbox.QueueDepthMaxDefault, 1, 10_000_000),
	}
	return h
}

// open builds the hand-off, or nil when it is off.
func (h handoffSettings) open(db *postgres.DB, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) postgres.Handoff {
	if h.eventsMax == 0 {
		return nil
	}
	return outbox.NewHandoff(outbox.HandoffOptions{
		Redis: rdb, Release: db, Log: log, Registerer: reg,
		EventsMax: h.eventsMax, TaskEvents: h.taskEvents, DepthMax: h.depthMax,
	})
}
