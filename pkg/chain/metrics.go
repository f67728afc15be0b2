package chain

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Values of settle_chain_breaker_state.
const (
	stateGaugeClosed   = 0
	stateGaugeHalfOpen = 1
	stateGaugeOpen     = 2
)

// Label values of the breaker's store: the shared Redis state, or the
// in-process fallback used while Redis is unreachable.
const (
	storeRedis     = "redis"
	storeInProcess = "in_process"
)

// rpcLatencyBuckets span a fast local node (~1ms) to the 5s call deadline.
var rpcLatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type clientMetrics struct {
	calls        *prometheus.CounterVec
	errors       *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	state        prometheus.Gauge
	fallback     prometheus.Gauge
	transitions  *prometheus.CounterVec
	rejected     prometheus.Counter
	redisFailure *prometheus.CounterVec
}

func newClientMetrics(reg prometheus.Registerer) *clientMetrics {
	m := &clientMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_rpc_calls_total", Help: "Ethereum JSON-RPC calls made (not counting calls the breaker refused), by method.",
		}, []string{"method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_rpc_errors_total", Help: "Ethereum JSON-RPC calls that failed (transport, timeout, node error), by method.",
		}, []string{"method"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "settle_chain_rpc_duration_seconds", Help: "Latency of Ethereum JSON-RPC calls, by method.", Buckets: rpcLatencyBuckets,
		}, []string{"method"}),
		state: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_chain_breaker_state", Help: "RPC circuit breaker state as this process last saw it: 0 closed, 1 half-open, 2 open.",
		}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "settle_chain_breaker_fallback", Help: "1 while this process uses its in-process breaker because Redis is unreachable.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_breaker_transitions_total", Help: "RPC circuit breaker transitions performed by this process, by target state and store.",
		}, []string{"to", "store"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "settle_chain_breaker_rejected_total", Help: "RPC calls refused by the circuit breaker without reaching the node.",
		}),
		redisFailure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_breaker_redis_errors_total", Help: "Breaker round trips to Redis that failed (the in-process breaker decided instead), by operation.",
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.errors, m.latency, m.state, m.fallback, m.transitions, m.rejected, m.redisFailure)
	}
	// Every method's error count exists at 0 from the start, so
	// SettleChainRPCErrors' increase() counts a method's first errors.
	for _, method := range rpcMethods {
		m.errors.WithLabelValues(method)
	}
	return m
}

// rpcMethods are every method the client calls.
var rpcMethods = []string{
	methodChainID, methodReceipt, methodBlock, methodTx,
	MethodLogs, MethodTraceBlock, MethodTraceBlockByHash, MethodTraceTx,
}

type cacheMetrics struct {
	lookups      *prometheus.CounterVec
	redisFailure *prometheus.CounterVec
}

// Label values of settle_chain_finality_cache_total.
const (
	cacheHitFinal    = "hit_final"
	cacheHitNotFinal = "hit_not_final"
	cacheMiss        = "miss"
	cacheError       = "error"
)

func newCacheMetrics(reg prometheus.Registerer) *cacheMetrics {
	m := &cacheMetrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_finality_cache_total", Help: "Finality cache lookups, by result (hit_final, hit_not_final, miss, error).",
		}, []string{"result"}),
		redisFailure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "settle_chain_cache_redis_errors_total", Help: "Finality cache reads and writes that failed in Redis (the chain was asked directly), by operation.",
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.lookups, m.redisFailure)
	}
	return m
}
