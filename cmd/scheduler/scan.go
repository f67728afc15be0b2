package main

import (
	"context"
	"errors"
	"fmt"
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

// scanNetwork is the network the one RPC of this round serves (issue
// "networks" gives each network its RPC_URL_<NETWORK>).
const scanNetwork = "ETH_MAINNET"

// scanStartTimeout bounds the trace probe at start.
const scanStartTimeout = 10 * time.Second

type scanSettings struct {
	// Interval zero: SCAN_INTERVAL=off, no scanner.
	Interval         time.Duration
	BlocksMax        int
	AddressesPerCall int
	PassTimeout      time.Duration
	Traces           bool
	Chain            finality.Settings
}

func readScanSettings(env *config.Env) scanSettings {
	s := scanSettings{
		Interval: config.Parse(env, "SCAN_INTERVAL", scan.IntervalDefault, func(v string) (time.Duration, error) {
			if v == "off" {
				return 0, nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return 0, fmt.Errorf("%q is not off or a positive duration like 15s", v)
			}
			return d, nil
		}),
		BlocksMax:        env.Int("SCAN_BLOCKS_MAX", scan.BlocksMaxDefault, 1, scan.BlocksMaxLimit),
		AddressesPerCall: env.Int("SCAN_ADDRESSES_PER_CALL", scan.AddressesPerCallDefault, 1, chain.ScanTopicsMax),
		PassTimeout:      env.Duration("SCAN_PASS_TIMEOUT", scan.PassTimeoutDefault),
		Traces:           env.OneOf("SCAN_TRACES", "off", "on", "off") == "on",
		Chain:            finality.ReadSettings(env, false),
	}
	return s
}

// startScanner starts the chain scanner when SCAN_INTERVAL is not off and
// the network has an RPC; the returned function stops it, waits for it
// and releases its client.
func startScanner(ctx context.Context, s scanSettings, db *postgres.DB, rdb redis.UniversalClient, alerts *alert.Alerter,
	owner string, log zerolog.Logger, reg prometheus.Registerer) (func(), error) {
	if s.Interval == 0 || !s.Chain.HasRPC() {
		log.Info().Bool("rpc", s.Chain.HasRPC()).Dur("interval", s.Interval).Msg("chain scanner off")
		return func() {}, nil
	}
	client, err := chain.Dial(ctx, s.Chain.RPCURL, chain.ClientOptions{
		Redis: rdb, Registerer: reg, Alerter: alerts, Logger: log, CallTimeout: s.Chain.CallTimeout, Breaker: s.Chain.Breaker,
	})
	if err != nil {
		return nil, fmt.Errorf("ETH_RPC_URL: %w", err)
	}
	if s.Traces {
		probeCtx, cancel := context.WithTimeout(ctx, scanStartTimeout)
		err := client.ProbeTraces(probeCtx)
		cancel()
		if errors.Is(err, chain.ErrTracesUnsupported) {
			client.Close()
			return nil, fmt.Errorf("SCAN_TRACES=on: %w; set SCAN_TRACES=off or use an endpoint with the debug API", err)
		}
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("SCAN_TRACES=on: the endpoint could not be asked whether it serves traces: %w", err)
		}
		// The endpoint serves traces, yet this build finds no internal
		// transfers with them: refusing beats a flag that silently does
		// nothing (issue 15 leaves trace scanning open).
		client.Close()
		return nil, errors.New("SCAN_TRACES=on: scanning internal transfers is not built yet; set SCAN_TRACES=off")
	}
	scanner := scan.New(scan.Options{
		Store:            db,
		Networks:         []scan.Network{{Name: scanNetwork, RPC: client, Policy: s.Chain.Policy}},
		Owner:            owner,
		BlocksMax:        uint64(s.BlocksMax),
		Interval:         s.Interval,
		AddressesPerCall: s.AddressesPerCall,
		PassTimeout:      s.PassTimeout,
		Log:              log.With().Str("component", "scanner").Logger(),
		Registerer:       reg,
	})
	scanCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		scanner.Run(scanCtx)
	}()
	log.Info().Str("network", scanNetwork).Dur("interval", s.Interval).Int("blocks_max", s.BlocksMax).
		Str("policy", s.Chain.Policy.String()).Msg("chain scanner started")
	return func() {
		cancel()
		<-done
		client.Close()
	}, nil
}
