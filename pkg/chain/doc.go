// Package chain is everything settle asks Ethereum: transaction receipts
// and block headers over JSON-RPC (go-ethereum's client is used here and
// nowhere else), behind a circuit breaker shared by all workers, with a
// finality cache, and the decisions the worker needs: CheckDeposit (may
// this deposit be credited under DEPOSIT_FINALITY?) and StillCanonical
// (is a credited transaction still where it was seen?).
//
// # Circuit breaker
//
// The seed's thresholds: 5 failed calls within 30s open the breaker; open,
// every call fails fast with ErrBreakerOpen (a payment.ErrUnavailable)
// for 60s; then it is half-open and exactly one caller, across all
// workers, gets the probe slot (SET NX, 10s TTL, or the call timeout
// plus the report's margin when that is longer); the probe's success
// closes the breaker, its failure opens it for another 60s.
//
//	closed --5 failures in 30s--> open --60s--> half-open --probe ok--> closed
//	                               ^                |
//	                               +--probe failed--+
//
// The state lives in Redis and moves only inside two Lua scripts, one
// round trip before a call (allowScript: allow, reject, or "you are the
// probe") and one after it (reportScript: record the outcome; tells
// exactly one reporter that it opened or closed the breaker, and only that
// process alerts). Nothing is held during the call itself, so calls from
// any number of workers run concurrently. An answer the finality cache
// could give without a call still asks whether the breaker is open (one
// EXISTS, no ticket): while it is open nothing is credited. gobreaker v2.4's
// DistributedCircuitBreaker, which holds its store's lock around the call,
// is deliberately not used. What counts: transport errors, timeouts
// (CallTimeoutDefault, 5s) and JSON-RPC errors are failures; "not found"
// is an answer; a caller that cancels its own context reports nothing.
//
// While Redis is unreachable each process falls back to an in-process
// gobreaker with the same thresholds (MaxRequests 1 in half-open, so one
// probe per process); Redis is asked again after
// BreakerRedisRetryAfterDefault. A Redis failure never turns into a
// refusal or a wrong answer, only into a less shared breaker.
//
// # Finality
//
// A receipt whose block is at or below the `finalized` block never
// changes, so it is cached for a day and answers later questions without
// the node; "not final yet" is a hint kept 30s. The finalized (and
// latest) headers are read before the receipt, so a receipt at or below
// that height is in the finalized chain, provided the header at its
// height has the receipt's block hash: before a terminal verdict (and
// before caching) that header is read, and a receipt of a block the
// headers do not show (a backend still on an abandoned fork) is a Wait.
// Every terminal verdict waits for the policy: a reverted or mismatching
// receipt in a block that can still be reorged is a Wait, not yet a
// Reverted or Mismatch.
//
// # Reorg evidence
//
// StillCanonical reads the receipt, then the header at the receipt's
// height: Final or Canonical at the same block; Moved when the header
// confirms a receipt in another block (the transaction was mined again
// there) that still pays the deposit as a credit would (status 1, the
// Transfer log, or the value and recipient); mined again without it, the
// deposit is Gone. Without a receipt, the block at the stored height decides (read
// with its transactions' hashes, in the same call): the same hash, or no
// block there yet, is Absent (a lagging node or index). Another hash is a
// fork, but one null is not evidence: the receipt is read again, and
// found is located as above; a second null is Gone only if the block now
// at that height lacks the transaction too, else Absent. Absent carries
// the head so the watcher can require a second absence
// REORG_RECHECK_DELAY and one new block later before calling it gone.
// Errors are never states.
package chain
