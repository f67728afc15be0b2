package chain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/tracing"
)

const (
	// CallTimeoutDefault bounds one RPC call; a node slower than this
	// counts as failing.
	CallTimeoutDefault = 5 * time.Second
	// httpIdleConnsMax keeps enough idle connections to the node for a
	// worker's concurrent calls (net/http keeps 2 by default, which would
	// re-dial on every burst).
	httpIdleConnsMax   = 64
	httpIdleTimeout    = 90 * time.Second
	httpDialTimeout    = 5 * time.Second
	httpTLSHandshake   = 5 * time.Second
	httpResponseHeader = CallTimeoutDefault
)

// txIndexingMessage is geth's answer, as message and error data, when a
// transaction is unknown while its indexer is still running. A remote
// JSON-RPC error carries no type, so its code and text are all there is to
// recognise it by.
const (
	txIndexingMessage = "transaction indexing is in progress"
	txIndexingCode    = -32000
)

// RPC method names, as metric labels.
const (
	methodReceipt = "eth_getTransactionReceipt"
	methodBlock   = "eth_getBlockByNumber"
	methodTx      = "eth_getTransactionByHash"
)

// BlockTag names a moving block.
type BlockTag string

const (
	TagLatest    BlockTag = "latest"
	TagSafe      BlockTag = "safe"
	TagFinalized BlockTag = "finalized"
)

// Receipt is what settle reads from a transaction receipt.
type Receipt struct {
	TxHash      string
	Status      uint64 // 1 success, 0 reverted
	BlockNumber uint64
	BlockHash   string
	// Transfers are the receipt's ERC-20 Transfer logs, in log order.
	Transfers []Transfer
	// FirstLogIndex is the block-wide index of the transaction's first
	// log: a log's index less this is its position in the transaction,
	// which stays the same when the transaction is mined in another block.
	FirstLogIndex uint
	// TxTo and TxValue are the transaction's own recipient and value,
	// filled in when a native deposit needs them; TxValue nil: not asked.
	TxTo    string
	TxValue *big.Int
}

// Transfer is one ERC-20 Transfer(address indexed from, address indexed
// to, uint256 value) log.
type Transfer struct {
	Contract string // lowercase address of the emitting contract
	From     string
	To       string
	Value    *big.Int
	LogIndex uint
}

// transferTopic is keccak256("Transfer(address,address,uint256)").
var transferTopic = common.HexToHash("0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef")

// ClientOptions configure Dial. Zero values take the defaults.
type ClientOptions struct {
	// Redis holds the breaker's shared state; nil leaves each process
	// with its own in-process breaker.
	Redis       redis.UniversalClient
	Registerer  prometheus.Registerer
	Alerter     Alerter
	Logger      zerolog.Logger // for what happens outside a call (in-process breaker transitions)
	CallTimeout time.Duration
	Breaker     BreakerSettings
	// HTTPClient replaces the default transport (tests, proxies). Its
	// answers are bounded by ResponseMax too, and it follows no redirect:
	// Dial uses a copy whose transport is wrapped.
	HTTPClient *http.Client
	// ResponseMax bounds one answer's body in bytes (RPC_RESPONSE_MAX);
	// zero takes ResponseMaxDefault.
	ResponseMax int64
	// ChainID, when set, is the chain the endpoint must serve: until an
	// eth_chainId answer has matched it, each call asks that first, and
	// an endpoint serving another chain answers every call ErrWrongChain.
	// So an endpoint down when its process started, or answering from
	// another chain once it is back, is never believed about anything.
	ChainID int64
}

// probeTTLFor is the probe slot's TTL for a call timeout: the default,
// or longer when the call may run longer, since the slot must outlast the
// probe call and the report that frees it, or a second probe gets out.
// So raising ETH_RPC_TIMEOUT lengthens the slot rather than fail at start.
func probeTTLFor(callTimeout time.Duration) time.Duration {
	return max(BreakerProbeTTLDefault, callTimeout+2*breakerRedisTimeout)
}

// Client is an Ethereum JSON-RPC client behind the circuit breaker: every
// call has a deadline, is counted and timed, and fails fast with
// ErrBreakerOpen while the breaker is open.
type Client struct {
	rpc         *rpc.Client
	eth         *ethclient.Client
	breaker     *breaker
	metrics     *clientMetrics
	callTimeout time.Duration
	// chainID is the chain it must serve (0: not checked); chainChecked
	// is set once eth_chainId matched, under chainMu so one caller asks.
	chainID      int64
	chainChecked atomic.Bool
	chainMu      sync.Mutex
	// redact takes the endpoint's API key (its path, query, user info)
	// out of every error leaving the client.
	redact *logging.Redactor
}

// Dial prepares a client for an http(s) JSON-RPC endpoint. It does not
// contact the node: a worker must start while the node is down, and the
// breaker deals with the outage.
func Dial(ctx context.Context, rawURL string, opts ClientOptions) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("ethereum rpc url must be an http:// or https:// URL")
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = CallTimeoutDefault
	}
	if opts.Breaker.ProbeTTL <= 0 {
		opts.Breaker.ProbeTTL = probeTTLFor(opts.CallTimeout)
	}
	settings := opts.Breaker.withDefaults()
	if settings.ProbeTTL <= opts.CallTimeout {
		// A probe outliving its slot would let a second probe out.
		return nil, fmt.Errorf("breaker probe TTL %s must exceed the call timeout %s", settings.ProbeTTL, opts.CallTimeout)
	}
	if opts.ResponseMax < 0 {
		return nil, fmt.Errorf("rpc response bound %d must not be negative", opts.ResponseMax)
	}
	if opts.ResponseMax == 0 {
		opts.ResponseMax = ResponseMaxDefault
	}
	var httpClient *http.Client
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		httpClient = &c
	} else {
		httpClient = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: httpDialTimeout}).DialContext,
			MaxIdleConns:          httpIdleConnsMax,
			MaxIdleConnsPerHost:   httpIdleConnsMax,
			IdleConnTimeout:       httpIdleTimeout,
			TLSHandshakeTimeout:   httpTLSHandshake,
			ResponseHeaderTimeout: max(httpResponseHeader, opts.CallTimeout),
		}}
	}
	httpClient.Transport = boundResponses(httpClient.Transport, opts.ResponseMax)
	// A redirect is an outage: following it re-sends the call to a host
	// nobody configured, with the endpoint (its API key) as Referer.
	httpClient.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	redact := logging.NewRedactor(rawURL)
	rc, err := rpc.DialOptions(ctx, rawURL, rpc.WithHTTPClient(httpClient))
	if err != nil {
		return nil, fmt.Errorf("ethereum rpc client: %w", redactError(redact, err))
	}
	metrics := newClientMetrics(opts.Registerer)
	return &Client{
		rpc:         rc,
		eth:         ethclient.NewClient(rc),
		breaker:     newBreaker(settings, opts.Redis, metrics, opts.Alerter, opts.Logger),
		metrics:     metrics,
		callTimeout: opts.CallTimeout,
		chainID:     opts.ChainID,
		redact:      redact,
	}, nil
}

// BreakerOpen is ErrBreakerOpen while the breaker is open, nil otherwise;
// it makes no call and takes no probe slot.
func (c *Client) BreakerOpen(ctx context.Context) error {
	if c.breaker.isOpen(ctx) {
		return ErrBreakerOpen
	}
	return nil
}

// Close releases the connections.
func (c *Client) Close() { c.rpc.Close() }

// Receipt fetches a transaction's receipt; ErrReceiptNotFound when the
// node has none.
func (c *Client) Receipt(ctx context.Context, txHash string) (*Receipt, error) {
	hash, err := ParseTxHash(txHash)
	if err != nil {
		return nil, err
	}
	var r *types.Receipt
	err = c.call(ctx, methodReceipt, func(ctx context.Context) error {
		var err error
		r, err = c.eth.TransactionReceipt(ctx, common.HexToHash(hash))
		switch {
		case errors.Is(err, ethereum.NotFound):
			return ErrReceiptNotFound
		case isTxIndexing(err):
			return ErrTxIndexing
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	receipt, err := convertReceipt(r, hash)
	if err != nil {
		return nil, payment.Unavailable("chain "+methodReceipt, err)
	}
	return receipt, nil
}

// Transaction fetches a transaction's recipient and value. It is asked only
// about a transaction whose receipt was just seen, so a node that does not
// know it is answering inconsistently: unavailable, ask again later.
func (c *Client) Transaction(ctx context.Context, txHash string) (Transaction, error) {
	hash, err := ParseTxHash(txHash)
	if err != nil {
		return Transaction{}, err
	}
	var raw json.RawMessage
	err = c.call(ctx, methodTx, func(ctx context.Context) error {
		return c.rpc.CallContext(ctx, &raw, methodTx, hash)
	})
	if err != nil {
		return Transaction{}, err
	}
	tx, ok, err := parseTransaction(raw)
	if err == nil && !ok {
		err = fmt.Errorf("no transaction %s, though its receipt exists", hash)
	}
	if err != nil {
		return Transaction{}, payment.Unavailable("chain "+methodTx, err)
	}
	return tx, nil
}

// HeaderByTag fetches the latest, safe or finalized header.
func (c *Client) HeaderByTag(ctx context.Context, tag BlockTag) (Header, error) {
	switch tag {
	case TagLatest, TagSafe, TagFinalized:
	default:
		return Header{}, payment.Invalid("block tag %q is not latest, safe or finalized", tag)
	}
	return c.header(ctx, string(tag))
}

// HeaderByNumber fetches the canonical header at a height; ErrBlockNotFound
// past the head.
func (c *Client) HeaderByNumber(ctx context.Context, number uint64) (Header, error) {
	return c.header(ctx, hexutil.EncodeUint64(number))
}

// BlockTxHashes fetches the canonical header at a height with the hashes
// of the block's transactions, in one call; ErrBlockNotFound past the head.
func (c *Client) BlockTxHashes(ctx context.Context, number uint64) (Header, []string, error) {
	raw, h, err := c.block(ctx, hexutil.EncodeUint64(number))
	if err != nil {
		return Header{}, nil, err
	}
	txs, err := parseTxHashes(raw)
	if err != nil {
		return Header{}, nil, payment.Unavailable("chain "+methodBlock, err)
	}
	return h, txs, nil
}

func (c *Client) header(ctx context.Context, block string) (Header, error) {
	_, h, err := c.block(ctx, block)
	return h, err
}

// block reads a block without its transactions' bodies: the header, and
// the raw answer for whoever needs more of it.
func (c *Client) block(ctx context.Context, block string) (json.RawMessage, Header, error) {
	var raw json.RawMessage
	err := c.call(ctx, methodBlock, func(ctx context.Context) error {
		return c.rpc.CallContext(ctx, &raw, methodBlock, block, false)
	})
	if err != nil {
		return nil, Header{}, err
	}
	h, ok, err := parseHeader(raw)
	if err != nil {
		return nil, Header{}, payment.Unavailable("chain "+methodBlock, err)
	}
	if !ok {
		return nil, Header{}, fmt.Errorf("block %s: %w", block, ErrBlockNotFound)
	}
	return raw, h, nil
}

// call runs one RPC call under the breaker and the call deadline. Not
// found is an answer (success for the breaker); the caller's own
// cancellation says nothing about the node; anything else is a failure.
func (c *Client) call(ctx context.Context, method string, do func(ctx context.Context) error) (err error) {
	if c.chainID != 0 && method != methodChainID && !c.chainChecked.Load() {
		if err := c.checkChain(ctx); err != nil {
			return payment.Unavailable("chain "+method, err)
		}
	}
	ctx, span := tracing.StartChild(ctx, "chain.rpc", tracing.Client)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("rpc.system", "jsonrpc"), attribute.String("rpc.method", method))
	}
	defer func() {
		failure := err
		if errors.Is(err, ErrReceiptNotFound) {
			failure = nil // an answer, not a failure
		}
		tracing.End(span, failure)
	}()
	t, err := c.breaker.allow(ctx)
	if err != nil {
		return fmt.Errorf("chain %s: %w", method, err)
	}
	callCtx, cancel := context.WithTimeout(ctx, c.callTimeout)
	start := time.Now()
	err = do(callCtx)
	cancel()
	c.metrics.calls.WithLabelValues(method).Inc()
	c.metrics.latency.WithLabelValues(method).Observe(time.Since(start).Seconds())

	o := outcomeSuccess
	switch {
	case err == nil, errors.Is(err, ErrReceiptNotFound), errors.Is(err, ErrTxIndexing), errors.Is(err, ErrTxTraceUnsupported):
	case ctx.Err() != nil:
		o = outcomeIgnore
	default:
		o = outcomeFailure
		c.metrics.errors.WithLabelValues(method).Inc()
	}
	// The endpoint's path and query hold the provider's API key
	// (https://host/v3/<key>), and these errors reach logs, alerts and
	// DLQ rows.
	err = redactError(c.redact, err)
	c.breaker.report(ctx, t, o, err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrReceiptNotFound):
		return err
	}
	return payment.Unavailable("chain "+method, err)
}

// Bounds of an error's text once redacted: an error page (an HTTP error's
// body, up to 64 KiB) is shown by its first bytes only, and the whole text
// is cut too, since it lands in rows, alerts and log lines.
const (
	errorBodyShownMax = 300
	errorTextMax      = 1024
)

// redactError is err with the endpoint's secrets out of its text, wherever
// they appear (a server's error page may repeat the requested path), an
// HTTP error's page shortened to one line of errorBodyShownMax bytes, and
// the text cut at errorTextMax. errors.Is and errors.As see err as before.
func redactError(redact *logging.Redactor, err error) error {
	if err == nil {
		return nil
	}
	msg := logging.RedactError(err).Error()
	var httpErr rpc.HTTPError
	if errors.As(err, &httpErr) && len(httpErr.Body) > 0 {
		// Secrets out before the cut, so none is left half there.
		body := strings.Join(strings.Fields(redact.String(string(httpErr.Body))), " ")
		msg = strings.Replace(msg, httpErr.Error(), httpErr.Status+": "+logging.Cut(body, errorBodyShownMax), 1)
	}
	return logging.Redacted(err, logging.Cut(redact.String(msg), errorTextMax))
}

func isTxIndexing(err error) bool {
	var dataErr rpc.DataError
	if errors.As(err, &dataErr) {
		if data, ok := dataErr.ErrorData().(string); ok && data == txIndexingMessage {
			return true
		}
	}
	var rpcErr rpc.Error
	return errors.As(err, &rpcErr) && rpcErr.ErrorCode() == txIndexingCode && rpcErr.Error() == txIndexingMessage
}

func convertReceipt(r *types.Receipt, wantHash string) (*Receipt, error) {
	if r == nil || r.BlockNumber == nil {
		return nil, errors.New("receipt without a block number")
	}
	if got := strings.ToLower(r.TxHash.Hex()); got != wantHash {
		return nil, fmt.Errorf("asked for the receipt of %s, the node answered with %s", wantHash, got)
	}
	if !r.BlockNumber.IsUint64() {
		return nil, fmt.Errorf("receipt block number %s does not fit 64 bits", r.BlockNumber)
	}
	out := &Receipt{
		TxHash:      wantHash,
		Status:      r.Status,
		BlockNumber: r.BlockNumber.Uint64(),
		BlockHash:   strings.ToLower(r.BlockHash.Hex()),
	}
	if len(r.Logs) > 0 && r.Logs[0] != nil {
		out.FirstLogIndex = r.Logs[0].Index
	}
	for _, l := range r.Logs {
		if l == nil || l.Removed || len(l.Topics) != 3 || l.Topics[0] != transferTopic {
			// Four topics is ERC-721's Transfer (token id indexed), which
			// is never a fungible deposit.
			continue
		}
		from, okFrom := topicAddress([32]byte(l.Topics[1]))
		to, okTo := topicAddress([32]byte(l.Topics[2]))
		value, okValue := wordValue(l.Data)
		if !okFrom || !okTo || !okValue {
			continue
		}
		out.Transfers = append(out.Transfers, Transfer{
			Contract: strings.ToLower(l.Address.Hex()),
			From:     from, To: to, Value: value, LogIndex: l.Index,
		})
	}
	return out, nil
}
