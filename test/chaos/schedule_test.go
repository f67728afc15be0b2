package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// faultKind names what the injector does.
type faultKind string

const (
	killWorker    faultKind = "kill-worker"    // SIGKILL a worker, restart it after Hold
	killScheduler faultKind = "kill-scheduler" // SIGKILL the scheduler, restart after Hold
	killAPI       faultKind = "kill-api"       // SIGKILL the api, restart after Hold
	// Graceful variants of the kills: SIGTERM under load; the process must
	// exit 0 within SHUTDOWN_TIMEOUT, then it is started again after Hold.
	stopWorker    faultKind = "sigterm-worker"
	stopScheduler faultKind = "sigterm-scheduler"
	stopAPI       faultKind = "sigterm-api"
	redisRestart  faultKind = "redis-restart" // stop Redis (no persistence: data lost), start after Hold
	pgRestart     faultKind = "pg-restart"    // fast shutdown, start after Hold
	pgKill        faultKind = "pg-kill"       // SIGKILL every server process, crash recovery on start
	pgPause       faultKind = "pg-pause"      // SIGSTOP for Hold, beyond the ledger's timeouts
	linkLatency   faultKind = "latency"       // add Latency to a link for Hold
	linkReset     faultKind = "reset"         // RST every connection of a link (or of all links to a backend)
	linkBlackhole faultKind = "blackhole"     // swallow a link's traffic for Hold
	// Chain mode: faults of the JSON-RPC proxy in front of the node.
	rpcNulls     faultKind = "rpc-nulls"     // null for every receipt (per-transaction budget) for Hold
	rpcErrors    faultKind = "rpc-errors"    // fail a share (Rate) of requests with 5xx or a reset for Hold
	rpcReset     faultKind = "rpc-reset"     // reset every request's connection for Hold
	rpcLatency   faultKind = "rpc-latency"   // add Latency to every request for Hold
	rpcBlackhole faultKind = "rpc-blackhole" // hold every request unanswered for Hold
	rpcLag       faultKind = "rpc-lag"       // a node Blocks behind the head for Hold
	chainReorg   faultKind = "chain-reorg"   // a real fork drops a recent transfer (depth 1..reorgDepthMax)
)

// Schedule bounds. Every duration the injector uses comes from here.
const (
	// warmup lets the load reach the system before the first fault.
	warmup = 3 * time.Second
	// gapMin and gapMax space the faults' start times.
	gapMin = 400 * time.Millisecond
	gapMax = 3 * time.Second
	// concurrentFaultsMax is how many faults may be active at once: they
	// do overlap, but never so many that nothing makes progress.
	concurrentFaultsMax = 3
	// resourceRest keeps a resource alone for a moment after its fault.
	resourceRest = time.Second
	// downMax bounds how long a killed process or a stopped server stays
	// down before the injector starts it again.
	downMax = 3 * time.Second
	// pauseMin exceeds LEDGER_LOCK_TIMEOUT and LEDGER_STATEMENT_TIMEOUT
	// of the soak, so a pause outlasts both; pauseMax bounds it.
	pauseMin = 3 * time.Second
	pauseMax = 8 * time.Second
	// latency windows and amounts.
	latencyHoldMin = 2 * time.Second
	latencyHoldMax = 10 * time.Second
	latencyMin     = 20 * time.Millisecond
	latencyMax     = 400 * time.Millisecond
	// blackholes.
	blackholeMin = time.Second
	blackholeMax = 6 * time.Second
	// RPC fault windows. rpcLatencyMax exceeds the soak's ETH_RPC_TIMEOUT,
	// so some calls time out.
	rpcHoldMin       = time.Second
	rpcHoldMax       = 6 * time.Second
	rpcResetHoldMax  = 1500 * time.Millisecond
	rpcLatencyMin    = 50 * time.Millisecond
	rpcLatencyMax    = 3 * time.Second
	rpcErrorShareMin = 30 // percent
	rpcErrorShareMax = 90
	rpcLagHoldMax    = 3 * time.Second
	rpcLagBlocksMax  = 3
	// reorgDepthMax bounds the blocks a chain-reorg drops.
	reorgDepthMax = 5
	// gracefulPct of the process kills are a SIGTERM instead (drawn
	// from a stream of their own, so a seed's timings stay what they were).
	gracefulPct = 40
	// plannedFaultsMax bounds one schedule, whatever the duration.
	plannedFaultsMax = 10_000
)

// Workers in the soak; kill-worker picks one.
const workerCount = 3

// Links are the proxied paths from a group of processes to a backend.
var links = []string{"api→pg", "workers→pg", "scheduler→pg", "api→redis", "workers→redis", "scheduler→redis"}

// fault is one planned injection. At is its offset from the start of
// the fault phase; Hold how long it lasts.
type fault struct {
	At      time.Duration
	Kind    faultKind
	Target  string
	Hold    time.Duration
	Latency time.Duration
	Share   int    // rpc-errors: percent of requests failed
	Blocks  uint64 // rpc-lag: how far behind
}

func (f fault) String() string {
	s := fmt.Sprintf("%s %s", f.Kind, f.Target)
	if f.Hold > 0 {
		s += " for " + f.Hold.Round(time.Millisecond).String()
	}
	if f.Latency > 0 {
		unit := "/chunk"
		if f.resource() == "rpc" {
			unit = "/request"
		}
		s += " +" + f.Latency.Round(time.Millisecond).String() + unit
	}
	if f.Share > 0 {
		s += fmt.Sprintf(" %d%% of requests", f.Share)
	}
	switch {
	case f.Blocks > 0 && f.Kind == chainReorg:
		s += fmt.Sprintf(" depth ≤ %d", f.Blocks)
	case f.Blocks > 0:
		s += fmt.Sprintf(" %d blocks behind", f.Blocks)
	}
	return s
}

// resource is what the fault occupies: no two faults on one resource run
// at once (a server cannot be paused while it is being restarted).
func (f fault) resource() string {
	switch f.Kind {
	case pgRestart, pgKill, pgPause:
		return "pg"
	case redisRestart:
		return "redis"
	case rpcNulls, rpcErrors, rpcReset, rpcLatency, rpcBlackhole, rpcLag:
		return "rpc"
	case chainReorg:
		return "chain"
	}
	return f.Target
}

// end is when the fault is over, relative to the fault phase.
func (f fault) end() time.Duration { return f.At + f.Hold }

// gracefulOf maps each kill to its SIGTERM variant.
var gracefulOf = map[faultKind]faultKind{killWorker: stopWorker, killScheduler: stopScheduler, killAPI: stopAPI}

type weighted struct {
	kind   faultKind
	weight int
}

// faultWeights: process kills and network trouble are common, restarts
// of the backends rarer (each costs seconds of recovery on this machine).
var faultWeights = []weighted{
	{killWorker, 5}, {killScheduler, 2}, {killAPI, 2},
	{redisRestart, 2}, {pgRestart, 1}, {pgKill, 1}, {pgPause, 2},
	{linkLatency, 3}, {linkReset, 3}, {linkBlackhole, 2},
}

// chainFaultWeights join faultWeights in chain mode.
var chainFaultWeights = []weighted{
	{rpcNulls, 3}, {rpcErrors, 2}, {rpcReset, 1}, {rpcLatency, 2}, {rpcBlackhole, 2}, {rpcLag, 2},
	{chainReorg, 2},
}

func weightsFor(chain bool) []weighted {
	if !chain {
		return faultWeights
	}
	return append(slices.Clone(faultWeights), chainFaultWeights...)
}

// planFaults lays out the whole schedule from the seed alone, before
// anything runs: the same seed and duration give the same faults, at the
// same offsets, whatever the machine's timing.
func planFaults(seed uint64, duration time.Duration, chain bool) []fault {
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	graceful := rand.New(rand.NewPCG(seed, 0x5167e))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	weights := weightsFor(chain)
	total := 0
	for _, w := range weights {
		total += w.weight
	}
	var faults []fault
	busy := map[string]time.Duration{}
	at := warmup
	for len(faults) < plannedFaultsMax {
		at += between(gapMin, gapMax)
		if at >= duration {
			break
		}
		pick := rng.IntN(total)
		var kind faultKind
		for _, w := range weights {
			if pick < w.weight {
				kind = w.kind
				break
			}
			pick -= w.weight
		}
		f := fault{At: at, Kind: kind}
		switch kind {
		case killWorker:
			f.Target, f.Hold = fmt.Sprintf("worker-%d", 1+rng.IntN(workerCount)), between(0, downMax)
		case killScheduler:
			f.Target, f.Hold = "scheduler", between(0, downMax)
		case killAPI:
			f.Target, f.Hold = "api", between(0, downMax)
		case redisRestart:
			f.Target, f.Hold = "redis", between(0, downMax)
		case pgRestart, pgKill:
			f.Target, f.Hold = "pg", between(0, downMax)
		case pgPause:
			f.Target, f.Hold = "pg", between(pauseMin, pauseMax)
		case linkLatency:
			f.Target, f.Hold, f.Latency = links[rng.IntN(len(links))], between(latencyHoldMin, latencyHoldMax), between(latencyMin, latencyMax)
		case linkReset:
			// Sometimes every connection to a backend at once.
			targets := append(slices.Clone(links), "*→pg", "*→redis")
			f.Target = targets[rng.IntN(len(targets))]
		case linkBlackhole:
			f.Target, f.Hold = links[rng.IntN(len(links))], between(blackholeMin, blackholeMax)
		case rpcNulls, rpcBlackhole:
			f.Target, f.Hold = "workers→rpc", between(rpcHoldMin, rpcHoldMax)
		case rpcErrors:
			f.Target, f.Hold, f.Share = "workers→rpc", between(rpcHoldMin, rpcHoldMax), rpcErrorShareMin+rng.IntN(rpcErrorShareMax-rpcErrorShareMin+1)
		case rpcReset:
			f.Target, f.Hold = "workers→rpc", between(0, rpcResetHoldMax)
		case rpcLatency:
			f.Target, f.Hold, f.Latency = "workers→rpc", between(rpcHoldMin, rpcHoldMax), between(rpcLatencyMin, rpcLatencyMax)
		case rpcLag:
			f.Target, f.Hold, f.Blocks = "workers→rpc", between(rpcHoldMin, rpcLagHoldMax), 1+rng.Uint64N(rpcLagBlocksMax)
		case chainReorg:
			f.Target, f.Blocks = "chain", 1+rng.Uint64N(reorgDepthMax)
		}
		// Every fault ends inside the fault phase.
		if f.end() > duration {
			continue
		}
		if busy[f.resource()] > at {
			continue
		}
		active := 0
		for _, g := range faults {
			if g.At <= at && at < g.end() {
				active++
			}
		}
		if active >= concurrentFaultsMax {
			continue
		}
		busy[f.resource()] = f.end() + resourceRest
		if g, ok := gracefulOf[f.Kind]; ok && graceful.IntN(100) < gracefulPct {
			f.Kind = g
		}
		faults = append(faults, f)
	}
	return faults
}

// linkTargets resolves a link fault's target to proxy names.
func linkTargets(target string) []string {
	backend, ok := strings.CutPrefix(target, "*→")
	if !ok {
		return []string{target}
	}
	var out []string
	for _, l := range links {
		if strings.HasSuffix(l, "→"+backend) {
			out = append(out, l)
		}
	}
	return out
}

// TestPlanFaults: a seed always gives the same schedule; every fault is
// bounded and inside the phase; a resource never carries two faults at
// once; some faults overlap; every kind shows up across a few seeds.
func TestPlanFaults(t *testing.T) {
	const duration = 5 * time.Minute
	seen := map[faultKind]bool{}
	overlaps := 0
	for seed := uint64(1); seed <= 5; seed++ {
		a, b := planFaults(seed, duration, true), planFaults(seed, duration, true)
		if !slices.Equal(a, b) {
			t.Fatalf("seed %d: two plans differ", seed)
		}
		if len(a) < 20 {
			t.Fatalf("seed %d: only %d faults in %s", seed, len(a), duration)
		}
		for i, f := range a {
			seen[f.Kind] = true
			if f.At < warmup || f.end() > duration || f.Hold < 0 || f.Hold > max(pauseMax, latencyHoldMax) || f.Latency > max(latencyMax, rpcLatencyMax) {
				t.Fatalf("seed %d: fault out of bounds: %+v", seed, f)
			}
			if f.Kind == pgPause && f.Hold < pauseMin {
				t.Fatalf("seed %d: pause shorter than the ledger timeouts: %+v", seed, f)
			}
			for _, g := range a[:i] {
				if g.end() > f.At {
					overlaps++
					if g.resource() == f.resource() {
						t.Fatalf("seed %d: %v and %v share %s at once", seed, g, f, f.resource())
					}
				}
			}
		}
	}
	for _, w := range weightsFor(true) {
		if !seen[w.kind] {
			t.Errorf("no %s fault in five seeds", w.kind)
		}
		if g, ok := gracefulOf[w.kind]; ok && !seen[g] {
			t.Errorf("no %s fault in five seeds", g)
		}
	}
	if overlaps == 0 {
		t.Error("faults never overlap")
	}
	for _, f := range planFaults(1, duration, false) {
		if f.resource() == "rpc" {
			t.Fatalf("chain fault %v planned without the chain", f)
		}
	}
	if got := linkTargets("*→redis"); len(got) != 3 {
		t.Errorf("*→redis is %v", got)
	}
}
