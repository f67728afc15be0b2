// Command scheduler runs the outbox enqueuer (LISTEN/NOTIFY plus a poll)
// and the periodic jobs. Any number of replicas may run: the enqueuer's
// claims skip each other's rows and every job period runs once.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/opsserver"
	"github.com/settle/settle/pkg/outbox"
	"github.com/settle/settle/pkg/periodic"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/service"
	"github.com/settle/settle/pkg/task"
)

type settings struct {
	service.Common
	MetricsAddr        string
	ListenURL          string
	PollInterval       time.Duration
	EnqueueBatch       int
	TaskEvents         int
	QueueDepthMax      int
	StaleEnqueuedAfter time.Duration
	RecoverInterval    time.Duration
	MaxRecoveries      int
	DrainInterval      time.Duration
	ReorgWatchInterval time.Duration
	NotifyInterval     time.Duration
	CleanupAt          time.Duration
	Cleanup            cleanupSettings
	AlertWebhookURL    string
	Monitor            monitorSettings
	Scan               scanSettings
}

// cleanupSettings are the daily cleanup's.
type cleanupSettings struct {
	Retention time.Duration
	// PartitionLockTimeout bounds each partition DDL's wait for its lock.
	PartitionLockTimeout time.Duration
	// Batch and BatchTimeout bound each batch of its deletes.
	Batch        int
	BatchTimeout time.Duration
}

// Bounds of the scheduler's durations; outside them a setting stops the
// scheduler at start. Below intervalMin a job claims its period back to
// back (under 1µs every claim is refused and the job never runs); above
// intervalMax, the daily cleanup's period, a job runs about never while
// the alerts sized by its interval wait as long.
const (
	intervalMin = 10 * time.Millisecond
	intervalMax = 24 * time.Hour
	timeoutMin  = 10 * time.Millisecond
	timeoutMax  = time.Hour
	// staleAfterMin: sooner, recovery takes an event whose task the
	// enqueuer (or the api) is enqueueing right after its commit for lost,
	// spending its MAX_RECOVERY_ATTEMPTS. Test setups that want recovery
	// fast go down to a fraction of a second, so the floor is only that.
	staleAfterMin = 100 * time.Millisecond
	// cleanupTimeout bounds a cleanup run, so a batch cannot take longer.
	cleanupTimeout = time.Hour
	// partitionLockTimeoutMax: every ledger write queues behind a
	// partition DDL waiting for its lock.
	partitionLockTimeoutMax = 10 * time.Second
	// retentionMin: a day. Redeliveries are refused by their event id
	// whatever this says (events are never deleted), but the records are
	// the outcome of each idempotency key an operator audits and the
	// reorg watch reopens, and less than a day is a unit slip (24h for
	// 240h is not, and stays allowed). retentionMax: a year of daily
	// partitions and rows.
	retentionMin = 24 * time.Hour
	retentionMax = 365 * 24 * time.Hour
	// windowMin, windowMax bound PROVIDER_MISS_GRACE (and windowMax
	// HOT_PATH_CHECK_WINDOW, whose floor is its interval's): a
	// millisecond (the test setups' grace) up to a day, past which the full reconciliation (daily) and the providers'
	// retries make the window pointless while each run reads a day of
	// rows.
	windowMin = time.Millisecond
	windowMax = 24 * time.Hour
)

func readSettings(env *config.Env) settings {
	s := settings{
		Common:             service.ReadCommon(env),
		MetricsAddr:        config.Parse(env, "METRICS_ADDR", ":9092", config.ListenAddress),
		PollInterval:       env.DurationWithin("POLL_INTERVAL", 5*time.Second, intervalMin, intervalMax),
		EnqueueBatch:       env.Int("ENQUEUE_BATCH", outbox.EnqueueBatchDefault, 1, postgres.OutboxClaimMax/2),
		TaskEvents:         env.Int("TASK_EVENTS_MAX", outbox.TaskEventsDefault, 1, postgres.TaskEventsMax),
		QueueDepthMax:      env.Int("QUEUE_DEPTH_MAX", outbox.QueueDepthMaxDefault, 1, 10_000_000),
		StaleEnqueuedAfter: env.DurationWithin("STALE_ENQUEUED_AFTER", outbox.StaleEnqueuedAfterDefault, staleAfterMin, intervalMax),
		RecoverInterval:    env.DurationWithin("RECOVER_INTERVAL", outbox.RecoverIntervalDefault, intervalMin, intervalMax),
		MaxRecoveries:      env.Int("MAX_RECOVERY_ATTEMPTS", outbox.MaxRecoveryAttemptsDefault, 0, 1000),
		DrainInterval:      env.DurationWithin("DLQ_DRAIN_INTERVAL", time.Minute, intervalMin, intervalMax),
		ReorgWatchInterval: env.DurationWithin("REORG_WATCH_INTERVAL", 30*time.Second, intervalMin, intervalMax),
		NotifyInterval:     env.DurationWithin("NOTIFY_INTERVAL", 2*time.Second, intervalMin, intervalMax),
		CleanupAt:          config.Parse(env, "CLEANUP_AT", 3*time.Hour, parseTimeOfDay),
		AlertWebhookURL:    env.URL("ALERT_WEBHOOK_URL", "", "http", "https"),
	}
	s.ListenURL = env.String("DATABASE_LISTEN_URL", "")
	service.CheckDatabaseURL(env, "DATABASE_LISTEN_URL", s.ListenURL)
	if s.ListenURL == "" {
		s.ListenURL = s.DatabaseURL
	}
	s.Cleanup = cleanupSettings{
		Retention:            env.DurationWithin("PROCESSED_RETENTION", postgres.CleanupRetentionDefault, retentionMin, retentionMax),
		PartitionLockTimeout: env.DurationWithin("PARTITION_LOCK_TIMEOUT", postgres.PartitionLockTimeoutDefault, time.Millisecond, partitionLockTimeoutMax),
		Batch:                env.Int("CLEANUP_BATCH", postgres.CleanupBatchDefault, 1, postgres.CleanupBatchMax),
		BatchTimeout:         env.DurationWithin("CLEANUP_BATCH_TIMEOUT", postgres.CleanupBatchTimeoutDefault, timeoutMin, cleanupTimeout),
	}
	s.Monitor = readMonitorSettings(env)
	s.Scan = readScanSettings(env)
	return s
}

// parseTimeOfDay reads "HH:MM" (UTC) as an offset into the day.
func parseTimeOfDay(v string) (time.Duration, error) {
	t, err := time.Parse("15:04", v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day like 03:00", v)
	}
	d := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute
	if d == 0 {
		d = time.Nanosecond // midnight: due from the first instant of the day
	}
	return d, nil
}

func main() {
	service.Main("scheduler", readSettings, func(s settings) zerolog.Level { return s.LogLevel }, run)
}

func run(s settings, log zerolog.Logger) error {
	ctx, stop := service.SignalContext()
	defer stop()

	openCtx, cancelOpen := context.WithTimeout(ctx, service.StartTimeout)
	defer cancelOpen()
	db, err := postgres.Open(openCtx, s.DatabaseURL, postgres.Options{ConnsMax: 8, ApplicationName: "settle-scheduler"})
	if err != nil {
		return err
	}
	defer db.Close()
	rdb, err := redisconn.Open(s.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	inspector := asynq.NewInspectorFromRedisClient(rdb)

	reg := service.Registry()
	// asynq's own queue gauges (asynq_*), which asynqmon's Metrics tab
	// reads back from Prometheus. Collected at each scrape.
	reg.MustRegister(db.Collector(), outbox.QueueMetricsCollector(inspector))
	// The checks run on whichever replica wins each period: one cooldown
	// for them all, so a lasting condition pages once, not once a replica.
	alerts := alert.New(log, alert.Options{Service: "scheduler", WebhookURL: s.AlertWebhookURL, Registerer: reg, Shared: rdb})
	defer alerts.Close()
	sink := dlq.NewSink(db, rdb, log, reg)

	enqueuer := outbox.NewEnqueuer(outbox.EnqueuerOptions{
		Outbox: db, Client: client, Redis: rdb, Log: log, PollInterval: s.PollInterval,
		BatchMax: s.EnqueueBatch, TaskEvents: s.TaskEvents, DepthMax: s.QueueDepthMax, Registerer: reg,
	})
	recovery := &outbox.Recovery{
		Store: db, Inspector: inspector, Leases: outbox.RedisRecovery{Redis: rdb}, Resume: outbox.RedisRecovery{Redis: rdb},
		Alerts: alerts, Log: log, StaleAfter: s.StaleEnqueuedAfter, MaxAttempts: s.MaxRecoveries, BatchMax: outbox.RecoveryBatchDefault,
	}
	recovery.RegisterMetrics(reg)
	hostname, _ := os.Hostname()
	runner := &periodic.Runner{Periods: db, Owner: hostname + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()[:8], Log: log}
	runner.RegisterMetrics(reg)
	jobs := []periodic.Job{
		{Name: "recover_stale", Every: s.RecoverInterval, Run: recovery.Run},
		{Name: "drain_dlq", Every: s.DrainInterval, Run: func(ctx context.Context) error {
			report, err := sink.Drain(ctx)
			if report.Moved+report.Malformed+report.Failed+report.Logged > 0 {
				log.Info().Int("moved", report.Moved).Int("sanitised", report.Sanitised).Int("logged", report.Logged).
					Int("malformed", report.Malformed).Int("failed", report.Failed).
					Int64("remaining", report.Remaining).Bool("aborted", report.Aborted).Msg("dlq fallback drained")
			}
			return err
		}},
		{Name: "cleanup", Every: 24 * time.Hour, At: s.CleanupAt, Timeout: cleanupTimeout, Run: cleanup(db, alerts, log, reg, s.Cleanup)},
		{Name: "watch_reorgs", Every: s.ReorgWatchInterval, Run: enqueueMaintenance(client, rdb, task.QueueMaintenance, task.TypeWatchReorgs, s.ReorgWatchInterval)},
		// Idle, a period has nothing to deliver: asked first, it costs a
		// read instead of a claim, a task and the worker's query.
		{Name: "deliver_notifications", Every: s.NotifyInterval, Due: db.NotificationsDue, Run: enqueueMaintenance(client, rdb, task.QueueNotifications, task.TypeNotify, s.NotifyInterval)},
	}
	jobs = append(jobs, monitoringJobs(s.Monitor, db, alerts, log, reg)...)

	ops := opsserver.New(s.MetricsAddr, reg, service.ReadyCheck(db, rdb), log)
	if err := ops.Start(); err != nil {
		return fmt.Errorf("METRICS_ADDR %s: %w", s.MetricsAddr, err)
	}
	// Nothing is enqueued, scanned or run before the schema is current
	// (the probes answer meanwhile, /readyz saying "pending").
	if err := service.WaitForSchema(ctx, db, log); err != nil {
		return err
	}
	if registry, err := db.Assets(ctx); err != nil {
		return err
	} else if err := s.Scan.Chain.CheckListed(registry); err != nil {
		return err
	}

	stopScanner, err := startScanner(ctx, s.Scan, db, rdb, alerts, runner.Owner, log, reg)
	if err != nil {
		return err
	}
	defer stopScanner()

	done := make(chan struct{}, 3)
	go func() {
		postgres.Listen(ctx, s.ListenURL, postgres.OutboxChannel, enqueuer.Wake, func(err error) {
			log.Warn().Err(err).Msg("outbox listener trouble; the poll delivers meanwhile")
		})
		done <- struct{}{}
	}()
	go func() { enqueuer.Run(ctx); done <- struct{}{} }()
	go func() { runner.Run(ctx, jobs); done <- struct{}{} }()
	log.Info().Str("metrics_addr", s.MetricsAddr).Dur("poll_interval", s.PollInterval).Str("owner", runner.Owner).Msg("scheduler started")

	<-ctx.Done()
	log.Info().Msg("scheduler stopping")
	deadline := time.After(s.ShutdownTimeout)
	for range 3 {
		select {
		case <-done:
		case <-deadline:
			log.Warn().Msg("scheduler shutdown timed out; exiting with work in flight (it is all in PostgreSQL)")
			return nil
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = ops.Shutdown(shutdownCtx)
	_ = client.Close()
	log.Info().Msg("scheduler stopped")
	return nil
}

// cleanup keeps processed_events' daily partitions (days ahead created,
// days past retention dropped whole) and deletes old settled
// notifications, transfer reports and sightings, and the found ids of
// rescans that ended, in bounded batches. Each
// part runs whatever the others did: a partition maintenance, or one
// table's batch, failing every night must not let the other tables grow
// without bound. The failures are logged and returned together
// (settle_job_runs_total counts the run as an error).
func cleanup(db *postgres.DB, alerts *alert.Alerter, log zerolog.Logger, reg prometheus.Registerer, s cleanupSettings) func(context.Context) error {
	deferred := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "settle_partition_ddl_deferred_total",
		Help: "Partition DDL statements left for the next cleanup because their lock did not come within PARTITION_LOCK_TIMEOUT on any try.",
	})
	deleted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "settle_cleanup_deleted_rows_total",
		Help: "Rows the daily cleanup deleted (past PROCESSED_RETENTION; rescan_found: of rescans that ended), by table, counted as each batch commits.",
	}, []string{"table"})
	reg.MustRegister(deferred, deleted)
	batches := postgres.CleanupOptions{
		Batch:        s.Batch,
		BatchTimeout: s.BatchTimeout,
		Deleted:      func(table string, rows int64) { deleted.WithLabelValues(table).Add(float64(rows)) },
	}
	return func(ctx context.Context) error {
		report, partErr := db.MaintainPartitions(ctx, s.Retention, postgres.PartitionsAheadDefault, time.Now(),
			postgres.PartitionOptions{LockTimeout: s.PartitionLockTimeout, Trim: batches})
		log.Info().Int("created", report.Created).Int("dropped", report.Dropped).Int64("trimmed", report.Trimmed).
			Int64("default_rows", report.DefaultRows).Int64("moved", report.Moved).Strs("kept_pending", report.KeptPending).Msg("processed_events partitions")
		if len(report.Deferred) > 0 {
			// Harmless for a while (30 days are created ahead); the next
			// run tries again. Something holds locks on processed_events.
			deferred.Add(float64(len(report.Deferred)))
			log.Warn().Strs("deferred", report.Deferred).Dur("lock_timeout", s.PartitionLockTimeout).
				Msg("partition DDL did not get its lock in time; the next cleanup retries it")
		}
		if len(report.Skipped) > 0 {
			log.Warn().Strs("skipped", report.Skipped).
				Msg("days whose records were already in the default partition, too many to move in time: they stay there")
		}
		if report.DefaultRows > 0 || report.Moved > 0 {
			alerts.Raise("processed_events_default_partition", alert.Warning,
				"idempotency records fell outside every daily partition (is the cleanup job running?)",
				map[string]any{"rows": report.DefaultRows, "moved": report.Moved})
		}
		if partErr != nil {
			log.Error().Err(partErr).Msg("processed_events partition maintenance failed; the other cleanups run")
		}
		tables, cleanErr := db.Cleanup(ctx, s.Retention, batches)
		for _, t := range tables {
			ev := log.Info()
			if t.Err != nil {
				// The next night's run takes up what is left.
				ev = log.Error().Err(t.Err)
			}
			ev.Str("table", t.Table).Int64("deleted", t.Deleted).Int("batches", t.Batches).Bool("done", t.Done).Msg("cleanup")
		}
		return errors.Join(partErr, cleanErr)
	}
}

// maintenanceTimeout bounds one run of a maintenance task: its period,
// but a delivery run its lease, since a POST may take notify's
// RequestTimeout whatever NOTIFY_INTERVAL is (the deliverer starts only
// the POSTs that end within it, and runs one at a time).
func maintenanceTimeout(taskType string, every time.Duration) time.Duration {
	if taskType == task.TypeNotify {
		return notify.TaskTimeout
	}
	// asynq keeps timeouts in whole seconds: below one, it would be 0.
	return max(every, time.Second)
}

// enqueueMaintenance returns a job that hands a maintenance task to the
// workers; the task id carries the period, so a period is enqueued once,
// and none is while one of the job's tasks still waits in its queue (the
// queue is the job's alone).
// The wake-up that names the queue brings an idle worker to it at once
// (it asks about a queue found empty only every few seconds).
func enqueueMaintenance(client *asynq.Client, rdb redis.UniversalClient, queueName, taskType string, every time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		// The task is named by the period this scheduler claimed (the
		// database's clock), so a replica's skewed clock cannot name it
		// after a neighbouring period's task and be taken for a duplicate.
		start, ok := periodic.JobPeriod(ctx)
		if !ok {
			start = time.Now().Truncate(every)
		}
		// A task still waiting does this period's work when it starts: one
		// a period would pile up for as long as no worker runs. (Unreadable,
		// the task is enqueued as before.)
		if waiting, err := rdb.LLen(ctx, task.PendingListKey(queueName)).Result(); err == nil && waiting > 0 {
			return nil
		}
		period := start.UnixNano() / int64(every)
		_, err := client.EnqueueContext(ctx, asynq.NewTask(taskType, nil),
			asynq.Queue(queueName), asynq.TaskID(taskType+":"+strconv.FormatInt(period, 10)),
			asynq.MaxRetry(0), asynq.Timeout(maintenanceTimeout(taskType, every)), asynq.Retention(0))
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil // another scheduler's, which woke the workers
		}
		if err != nil {
			return err
		}
		// A lost wake-up costs the task a few seconds, never the task.
		_ = outbox.PublishQueueWake(ctx, rdb, queueName)
		return nil
	}
}
