// Command worker runs the asynq server that applies payment events to the
// ledger, plus the maintenance and notification tasks.
package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/notify"
	"github.com/settle/settle/pkg/opsserver"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/service"
	"github.com/settle/settle/pkg/worker"
)

type settings struct {
	service.Common
	MetricsAddr     string
	Concurrency     int
	PollInterval    time.Duration
	WakeWait        time.Duration
	BatchMax        int
	InFlightMax     int
	LockTimeout     time.Duration
	StatementTimout time.Duration
	RetryBaseDelay  time.Duration
	RetryMaxDelay   time.Duration
	// ContentionWindow: lock timeouts and the like retry this long, from
	// a task's first, without spending its budget.
	ContentionWindow time.Duration
	AlertWebhookURL  string
	NotifyURL        string
	NotifyKey        []byte // HMAC key of the notification signatures
	Chain            finality.Settings
}

func readSettings(env *config.Env) settings {
	s := settings{
		Common:           service.ReadCommon(env),
		MetricsAddr:      config.Parse(env, "METRICS_ADDR", ":9091", config.ListenAddress),
		Concurrency:      env.Int("WORKER_CONCURRENCY", 10, 1, 1000),
		PollInterval:     env.Duration("WORKER_POLL_INTERVAL", 20*time.Millisecond),
		WakeWait:         env.Duration("WORKER_WAKE_WAIT", worker.WakeWaitDefault),
		BatchMax:         env.Int("LEDGER_BATCH_MAX", worker.BatchMaxDefault, 1, postgres.LedgerBatchMax),
		InFlightMax:      env.Int("LEDGER_IN_FLIGHT", worker.InFlightMaxDefault, 1, 64),
		LockTimeout:      env.Duration("LEDGER_LOCK_TIMEOUT", postgres.LedgerLockTimeoutDefault),
		StatementTimout:  env.Duration("LEDGER_STATEMENT_TIMEOUT", postgres.LedgerStatementTimeoutDefault),
		RetryBaseDelay:   env.Duration("RETRY_BASE_DELAY", worker.RetryBaseDelay),
		RetryMaxDelay:    env.Duration("RETRY_MAX_DELAY", worker.RetryMaxDelay),
		ContentionWindow: env.Duration("RETRY_CONTENTION_WINDOW", worker.ContentionWindowDefault),
		AlertWebhookURL:  env.URL("ALERT_WEBHOOK_URL", "", "http", "https"),
		NotifyURL:        env.URL("NOTIFY_WEBHOOK_URL", "", "http", "https"),
	}
	if s.NotifyURL != "" {
		s.NotifyKey = config.Parse(env, "NOTIFY_WEBHOOK_SECRET", nil, parseNotifySecret)
		if s.NotifyKey == nil && env.String("NOTIFY_WEBHOOK_SECRET", "") == "" {
			env.Reject("NOTIFY_WEBHOOK_SECRET", errors.New("required when NOTIFY_WEBHOOK_URL is set: notifications are always signed"))
		}
	}
	// A base above the ceiling would be silently ignored; a ceiling past a
	// day leaves a failing event out of sight for longer than anyone
	// watches a retry.
	if s.RetryMaxDelay > worker.RetryMaxDelayMax {
		env.Reject("RETRY_MAX_DELAY", fmt.Errorf("at most %s", worker.RetryMaxDelayMax))
	}
	if s.RetryBaseDelay > s.RetryMaxDelay {
		env.Reject("RETRY_BASE_DELAY", fmt.Errorf("%s is above RETRY_MAX_DELAY (%s)", s.RetryBaseDelay, s.RetryMaxDelay))
	}
	// A poison event whose own statement times out retries this long
	// before it spends its budget.
	if s.ContentionWindow > worker.ContentionWindowMax {
		env.Reject("RETRY_CONTENTION_WINDOW", fmt.Errorf("at most %s", worker.ContentionWindowMax))
	}
	if s.WakeWait > worker.WakeWaitMax {
		env.Reject("WORKER_WAKE_WAIT", fmt.Errorf("at most %s: asynq's shutdown waits for it", worker.WakeWaitMax))
	}
	s.Chain = finality.ReadSettings(env, true)
	return s
}

// parseNotifySecret is notify.ParseSecret refusing placeholders too.
func parseNotifySecret(v string) ([]byte, error) {
	if why := config.WeakSecret(strings.TrimPrefix(v, notify.SecretPrefix)); why != "" {
		return nil, errors.New(why)
	}
	return notify.ParseSecret(v)
}

func main() {
	service.Main("worker", readSettings, func(s settings) zerolog.Level { return s.LogLevel }, run)
}

func run(s settings, log zerolog.Logger) error {
	ctx, stop := service.SignalContext()
	defer stop()

	openCtx, cancelOpen := context.WithTimeout(ctx, service.StartTimeout)
	defer cancelOpen()
	db, err := postgres.Open(openCtx, s.DatabaseURL, postgres.Options{
		ConnsMax:        int32(s.InFlightMax + 6),
		ApplicationName: "settle-worker",
	})
	if err != nil {
		return err
	}
	defer db.Close()
	rdb, err := redisconn.Open(s.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()

	reg := service.Registry()
	reg.MustRegister(db.Collector())
	// Serving /healthz and /readyz while waiting for migrations: the
	// probes see a live process whose schema is pending.
	ops := opsserver.New(s.MetricsAddr, reg, service.ReadyCheck(db, rdb), log)
	if err := ops.Start(); err != nil {
		return fmt.Errorf("METRICS_ADDR %s: %w", s.MetricsAddr, err)
	}
	// No task is taken before the schema is current: against an older one
	// the ledger's statements fail on missing tables or columns.
	if err := service.WaitForSchema(ctx, db, log); err != nil {
		return err
	}
	alerts := alert.New(log, alert.Options{Service: "worker", WebhookURL: s.AlertWebhookURL, Registerer: reg})
	defer alerts.Close()
	sink := dlq.NewSink(db, rdb, log, reg)
	batcher := worker.NewBatcher(db, postgres.LedgerOptions{
		LockTimeout: s.LockTimeout, StatementTimeout: s.StatementTimout, Notify: s.NotifyURL != "",
	}, s.BatchMax, s.InFlightMax, reg)
	readCtx, cancelRead := context.WithTimeout(ctx, service.StartTimeout)
	defer cancelRead()
	registry, err := db.Assets(readCtx)
	if err != nil {
		return err
	}
	if err := s.Chain.CheckListed(registry); err != nil {
		return err
	}
	go db.KeepRegistry(ctx, registry, s.RegistryRefresh, func(err error) {
		log.Warn().Err(err).Msg("registry reload failed; keeping the networks and assets read before")
	})
	// The api reads these to tell whether a provider's reorg report is
	// evidence or a reason to ask this chain, even without RPC settings
	// of its own.
	go db.KeepReportingRPCs(ctx, s.Chain.RPCNetworks(), func(err error) {
		log.Warn().Err(err).Msg("could not report this worker's RPC networks; retried in a few minutes")
	})
	wrongChain := make(chan error, 1)
	gate, closeGate, err := newGate(ctx, s.Chain, db, registry, rdb, alerts, log, reg, func(err error) {
		select {
		case wrongChain <- err:
		default:
		}
	})
	if err != nil {
		return err
	}
	defer closeGate()
	notify := newNotifier(s.NotifyURL, s.NotifyKey, db, alerts, log, reg)
	// Rechecks an api without an RPC hands over run on this gate.
	var rechecker worker.Rechecker
	if g, ok := gate.(*finality.Gate); ok && s.Chain.HasRPC() {
		rechecker = finality.NewRechecker(g, db)
	}
	handler := worker.NewWorker(worker.WorkerOptions{
		Log: log, Batcher: batcher, DeadLetters: sink, Alerts: alerts, Gate: gate, Notify: notify, Registerer: reg,
		Redis: rdb, ContentionWindow: s.ContentionWindow, Rechecker: rechecker,
	})

	batchCtx, stopBatches := context.WithCancel(context.Background())
	defer stopBatches()
	batchesDone := make(chan struct{})
	go func() {
		batcher.Run(batchCtx)
		close(batchesDone)
	}()

	// An idle worker waits for the enqueuer's wake-up instead of asking
	// Redis every WORKER_POLL_INTERVAL (see worker.Waker).
	waker := worker.NewWaker(rdb, s.WakeWait).WithLog(log)
	rdb.AddHook(waker.Hook())

	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:       s.Concurrency,
		Queues:            worker.QueueWeights,
		RetryDelayFunc:    worker.FullJitter(s.RetryBaseDelay, s.RetryMaxDelay),
		IsFailure:         worker.IsFailure,
		TaskCheckInterval: s.PollInterval,
		// Retries become due on this tick; asynq's 5s default would add up
		// to five seconds to every retry's backoff.
		DelayedTaskCheckInterval: time.Second,
		// asynq hands unfinished tasks back to the queue when this runs
		// out; the margin leaves time for the rest of the shutdown.
		ShutdownTimeout: max(s.ShutdownTimeout-5*time.Second, time.Second),
		Logger:          worker.AsynqLogger{Log: log},
		LogLevel:        asynq.WarnLevel,
	})
	if err := srv.Start(handler); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	log.Info().Str("metrics_addr", s.MetricsAddr).Int("concurrency", s.Concurrency).Int("cpus", runtime.NumCPU()).
		Str("finality", s.Chain.Policy.String()).Strs("networks", s.Chain.NetworkNames()).Msg("worker started")

	var fatal error
	select {
	case <-ctx.Done():
	case fatal = <-wrongChain:
		log.Error().Err(fatal).Msg("an rpc endpoint serves another chain than its network's; stopping")
	}
	log.Info().Msg("worker stopping: finishing tasks in flight")
	// Tasks in flight wait in the batcher, so it keeps running until asynq
	// has finished or handed back every task.
	waker.Stop() // asynq's shutdown waits for the dequeue under way
	srv.Shutdown()
	stopBatches()
	<-batchesDone
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ops.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn().Err(err).Msg("ops server shutdown")
	}
	log.Info().Msg("worker stopped")
	return fatal
}
