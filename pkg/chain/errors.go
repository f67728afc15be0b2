package chain

import (
	"errors"
	"fmt"

	"github.com/settle/settle/pkg/payment"
)

var (
	// ErrBreakerOpen: the RPC circuit breaker refused the call (open, or
	// half-open with the one probe already out). The chain was not asked;
	// ask again later. It is also payment.ErrUnavailable.
	ErrBreakerOpen = fmt.Errorf("%w: ethereum rpc circuit breaker is open", payment.ErrUnavailable)
	// ErrReceiptNotFound: the node knows no receipt for the transaction
	// (not mined yet, never sent, or dropped by a reorg). An answer, not an
	// outage: it does not count against the breaker.
	ErrReceiptNotFound = errors.New("transaction receipt not found")
	// ErrBlockNotFound: the node has no block at that number or tag.
	ErrBlockNotFound = errors.New("block not found")
	// ErrTxIndexing: the node has not finished indexing transactions, so
	// a missing receipt means nothing yet. It comes wrapped as
	// payment.ErrUnavailable; it does not count against the breaker (the
	// node is up and answering).
	ErrTxIndexing = errors.New("the node is still indexing transactions")
	// ErrNodeBehind: the node has no block at the height a transaction
	// was seen mined at, or its head is below it: it lags (a resync, a
	// rewound head, a backend behind a balancer), and a missing receipt
	// there is no evidence of a reorg. It is also payment.ErrUnavailable.
	ErrNodeBehind = fmt.Errorf("%w: the node is behind the block the transaction was seen in", payment.ErrUnavailable)
	// ErrOtherFork: a receipt came from another block than the one a
	// scan pass read its transaction in (a backend on another fork, or a
	// reorg between the two reads). The pass runs again.
	ErrOtherFork = errors.New("the receipt is from another block than the pass read")
	// ErrTxTraceUnsupported: the endpoint does not serve
	// debug_traceTransaction, without which an internal transfer cannot
	// be checked. It is also payment.ErrUnavailable (the deposit waits);
	// it does not count against the breaker (the node is up and answering).
	ErrTxTraceUnsupported = fmt.Errorf("%w: the endpoint does not serve debug_traceTransaction, which checks an internal transfer (trace:)", payment.ErrUnavailable)
)
