package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/chain"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/scan"
)

// scanStartTimeout bounds each trace probe at start.
const scanStartTimeout = 10 * time.Second

// scanPassTimeoutMin: a pass reads blocks and commits within it, and its
// lease (a quarter longer) is kept in whole milliseconds. timeoutMax
// bounds it from above: a replica killed mid-pass holds the network's
// cursor for the lease.
const scanPassTimeoutMin = time.Second

// scanLogsMaxMin: a busy mainnet block alone carries several hundred
// Transfers of USDT and USDC; a cap under that would read most blocks by
// recipient.
const scanLogsMaxMin = 1000

type scanSettings struct {
	// Interval zero: SCAN_INTERVAL=off, no scanner.
	Interval         time.Duration
	BlocksMax        int
	AddressesPerCall int
	// LogWindow zero: SCAN_LOG_WINDOW=off, always ask by recipient.
	LogWindow int
	LogsMax   int
	// BatchesInFlight: block batches a pass reads at once.
	BatchesInFlight int
	PassTimeout     time.Duration
	Traces          bool
	// ReorgRescan: blocks below the cursor rescanned after a reorg
	// replaced blocks it passed (0: never).
	ReorgRescan int
	Chain       finality.Settings
}

// reorgRescan is SCAN_REORG_RESCAN as scan.Options takes it: 0 turns the
// rescan off.
func reorgRescan(blocks int) int64 {
	if blocks == 0 {
		return -1
	}
	return int64(blocks)
}

func readScanSettings(env *config.Env) scanSettings {
	s := scanSettings{
		Interval: config.Parse(env, "SCAN_INTERVAL", scan.IntervalDefault, func(v string) (time.Duration, error) {
			if v == "off" {
				return 0, nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < intervalMin || d > intervalMax {
				return 0, fmt.Errorf("%q is not off or a duration like 15s from %s to %s", v, intervalMin, intervalMax)
			}
			return d, nil
		}),
		BlocksMax:        env.Int("SCAN_BLOCKS_MAX", scan.BlocksMaxDefault, 1, scan.BlocksMaxLimit),
		AddressesPerCall: env.Int("SCAN_ADDRESSES_PER_CALL", scan.AddressesPerCallDefault, 1, chain.ScanTopicsMax),
		LogWindow: config.Parse(env, "SCAN_LOG_WINDOW", scan.LogWindowDefault, func(v string) (int, error) {
			if v == "off" {
				return 0, nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > scan.LogWindowLimit {
				return 0, fmt.Errorf("%q is not off or a block count from 1 to %d", v, scan.LogWindowLimit)
			}
			return n, nil
		}),
		LogsMax:         env.Int("SCAN_LOGS_MAX", scan.LogsMaxDefault, scanLogsMaxMin, scan.LogsMaxLimit),
		BatchesInFlight: env.Int("SCAN_BATCHES_IN_FLIGHT", scan.BatchesInFlightDefault, 1, scan.BatchesInFlightLimit),
		PassTimeout:     env.DurationWithin("SCAN_PASS_TIMEOUT", scan.PassTimeoutDefault, scanPassTimeoutMin, timeoutMax),
		Traces:          env.OneOf("SCAN_TRACES", "off", "on", "off") == "on",
		ReorgRescan:     env.Int("SCAN_REORG_RESCAN", scan.ReorgRescanDefault, 0, scan.ReorgRescanLimit),
		Chain:           finality.ReadSettings(env, false),
	}
	return s
}

// startScanner starts the chain scanner when SCAN_INTERVAL is not off and
// the network has an RPC; the returned function stops it, waits for it
// and releases its client.
func startScanner(ctx context.Context, s scanSettings, db *postgres.DB, rdb redis.UniversalClient, alerts *alert.Alerter,
	owner string, log zerolog.Logger, reg prometheus.Registerer) (func(), error) {
	if !s.Chain.HasRPC() {
		log.Info().Bool("rpc", false).Dur("interval", s.Interval).Msg("chain scanner off")
		return func() {}, nil
	}
	// A scanner on another chain than its network's would store events
	// for transfers that never happened there (the worker, checking the
	// same ids, refuses to start the same way); with the registry, each
	// client also refuses calls until its node has said which chain it is.
	// Checked with the scanner off too: a setting naming the wrong chain
	// stops the scheduler at start, as the contract has it.
	registry, err := db.Assets(ctx)
	if err != nil {
		return nil, err
	}
	clients, err := finality.Dial(ctx, s.Chain, finality.Deps{Assets: registry, Redis: rdb, Alerts: alerts, Log: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	checkCtx, cancelCheck := context.WithTimeout(ctx, s.Chain.CallTimeout+time.Second)
	unreachable, err := finality.CheckChainIDs(checkCtx, clients, registry)
	cancelCheck()
	if err != nil {
		clients.Close()
		return nil, err
	}
	if s.Interval == 0 {
		clients.Close()
		log.Info().Bool("rpc", true).Dur("interval", s.Interval).Msg("chain scanner off")
		return func() {}, nil
	}
	if len(unreachable) > 0 {
		log.Warn().Strs("networks", unreachable).Msg("scanner rpc endpoints unreachable at start; each is asked its chain id before anything else once it answers")
	}
	var networks []scan.Network
	for _, n := range s.Chain.Networks {
		if client, ok := clients[n.Name]; ok {
			networks = append(networks, scan.Network{Name: n.Name, RPC: client, Policy: n.Policy})
		}
	}
	if s.Traces {
		if err := probeTraces(ctx, clients, networks, unreachable, log); err != nil {
			clients.Close()
			return nil, err
		}
	}
	scanner := scan.New(scan.Options{
		Store:            db,
		Networks:         networks,
		Owner:            owner,
		BlocksMax:        uint64(s.BlocksMax),
		Interval:         s.Interval,
		AddressesPerCall: s.AddressesPerCall,
		LogWindow:        uint64(max(s.LogWindow, 0)),
		FilteredLogs:     s.LogWindow == 0,
		LogsMax:          s.LogsMax,
		BatchesInFlight:  s.BatchesInFlight,
		PassTimeout:      s.PassTimeout,
		Traces:           s.Traces,
		ReorgRescan:      reorgRescan(s.ReorgRescan),
		Log:              log.With().Str("component", "scanner").Logger(),
		Registerer:       reg,
	})
	scanCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		scanner.Run(scanCtx)
	}()
	for _, n := range networks {
		log.Info().Str("network", n.Name).Dur("interval", s.Interval).Int("blocks_max", s.BlocksMax).
			Int("batches_in_flight", s.BatchesInFlight).Str("policy", n.Policy.String()).Msg("chain scanner started")
	}
	return func() {
		cancel()
		<-done
		clients.Close()
	}, nil
}

// probeTraces refuses SCAN_TRACES=on unless every reachable network's
// endpoint serves debug_traceBlockByNumber, and debug_traceBlockByHash
// under a policy whose passes trace the blocks they read by hash (see
// scan.TracesByHash): a flag that silently found nothing would be worse.
// An endpoint unreachable at start is not held against the scheduler (it
// does more than scan); its passes fail, naming SCAN_TRACES, if it turns
// out to lack the debug API.
func probeTraces(ctx context.Context, clients finality.Clients, networks []scan.Network, unreachable []string, log zerolog.Logger) error {
	byHash := map[string]bool{}
	for _, n := range networks {
		byHash[n.Name] = scan.TracesByHash(n.Policy)
	}
	for name, client := range clients {
		if slices.Contains(unreachable, name) {
			log.Warn().Str("network", name).Msg("SCAN_TRACES=on: endpoint unreachable at start; whether it serves traces is learnt at its first pass")
			continue
		}
		probeCtx, cancel := context.WithTimeout(ctx, scanStartTimeout)
		err := client.ProbeTraces(probeCtx, byHash[name])
		cancel()
		if errors.Is(err, chain.ErrTracesUnsupported) {
			return fmt.Errorf("SCAN_TRACES=on: %s: %w; set SCAN_TRACES=off or use an endpoint with the debug API", name, err)
		}
		if err != nil {
			return fmt.Errorf("SCAN_TRACES=on: %s: the endpoint could not be asked whether it serves traces: %w", name, err)
		}
	}
	return nil
}
