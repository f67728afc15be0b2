package chain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

// Bounds of the trace scan. A node's trace answer is outside input: it is
// refused, not trusted, past these.
const (
	// TraceBatchMax bounds the blocks traced in one batch (one HTTP
	// request): tracing is the node's slowest call and one call timeout
	// covers the whole batch.
	TraceBatchMax = 4
	// traceBlockBytesMax bounds one block's trace answer; a full mainnet
	// block's call traces are a few MiB.
	traceBlockBytesMax = 64 << 20
	// traceFramesMax bounds the call frames of one block: a 36M-gas block
	// of 100-gas warm calls has 360,000.
	traceFramesMax = 1_000_000
	// traceDepthMax: the EVM's call depth limit (1024) below the
	// transaction's own frame.
	traceDepthMax = 1025
	// traceValueHexMax: 0x and 64 hex digits, a 256-bit word.
	traceValueHexMax = 2 + 64
	// traceErrorShownMax bounds a frame's error as a reason shows it.
	traceErrorShownMax = 200
)

// InternalTransfer is ETH moved by a contract call: a nested CALL frame
// with value, in a transaction that succeeded, under no frame that failed.
type InternalTransfer struct {
	TxHash      string
	BlockNumber uint64
	// BlockHash: the block traced, when traced by hash (InternalTransfersAt).
	BlockHash string
	To        string // lowercase 0x
	Value     *big.Int
	// TraceAddress is the frame as Alchemy's typeTraceAddress names it:
	// the call type, then the Parity trace address ("CALL_0_1": the
	// second call of the first call of the transaction), in whichever
	// case; Index is what identifies it.
	TraceAddress string
}

// Index is the transfer index every reporter derives for it (lowercase,
// as payment.TraceTransfer spells it).
func (t InternalTransfer) Index() string { return payment.TraceTransfer(t.TraceAddress) }

// callFrame is the part of a callTracer frame the scan reads.
type callFrame struct {
	Type  string      `json:"type"`
	To    *string     `json:"to"`
	Value *string     `json:"value"`
	Error string      `json:"error"`
	Calls []callFrame `json:"calls"`
}

// txTrace is one transaction of debug_traceBlockByNumber's answer.
type txTrace struct {
	TxHash *string    `json:"txHash"`
	Result *callFrame `json:"result"`
	Error  string     `json:"error"`
}

// precompiles: Parity traces, and so Alchemy's trace addresses (and geth's
// flatCallTracer, built to match them), leave out a CALL or STATICCALL to
// a precompile, so it takes no index. 0x01..0x11 through Prague's BLS
// ones, 0x100 P256VERIFY (Osaka; RIP-7212 on the L2s).
func precompile(to string) bool {
	digits, ok := strings.CutPrefix(to, "0x")
	if !ok || len(digits) != 40 {
		return false
	}
	n, err := strconv.ParseUint(strings.TrimLeft(digits, "0"), 16, 64)
	if err != nil {
		return false // more than 64 bits: no precompile
	}
	return (n >= 0x01 && n <= 0x11) || n == 0x100
}

// InternalTransfers traces blocks (at most TraceBatchMax) in one batch of
// debug_traceBlockByNumber with the call tracer and returns the internal
// transfers in them, in block and trace order.
func (c *Client) InternalTransfers(ctx context.Context, numbers []uint64) ([]InternalTransfer, error) {
	args := make([]any, len(numbers))
	for i, n := range numbers {
		args[i] = hexutil.EncodeUint64(n)
	}
	return c.traceBlocks(ctx, MethodTraceBlock, args, numbers, nil)
}

// BlockID names a block read: its number and hash.
type BlockID struct {
	Number uint64
	Hash   string
}

// InternalTransfersAt is InternalTransfers for the blocks of these
// hashes, with debug_traceBlockByHash: a node without one of the blocks
// (on another branch) errs rather than trace the block it has at that
// height, so what is found is in the blocks named.
func (c *Client) InternalTransfersAt(ctx context.Context, blocks []BlockID) ([]InternalTransfer, error) {
	args := make([]any, len(blocks))
	numbers := make([]uint64, len(blocks))
	hashes := make([]string, len(blocks))
	for i, b := range blocks {
		hash, err := parseHex(b.Hash, hashHexLength, "block hash")
		if err != nil {
			return nil, payment.Invalid("trace of block %d %q: %v", b.Number, b.Hash, err)
		}
		args[i], numbers[i], hashes[i] = hash, b.Number, hash
	}
	return c.traceBlocks(ctx, MethodTraceBlockByHash, args, numbers, hashes)
}

// traceBlocks traces one batch, the blocks named by args (numbers, or
// hashes: then given too).
func (c *Client) traceBlocks(ctx context.Context, method string, args []any, numbers []uint64, hashes []string) ([]InternalTransfer, error) {
	if len(args) > TraceBatchMax {
		return nil, payment.Invalid("%d blocks traced in one batch, at most %d", len(args), TraceBatchMax)
	}
	raws := make([]json.RawMessage, len(args))
	elems := make([]rpc.BatchElem, len(args))
	for i, a := range args {
		elems[i] = rpc.BatchElem{Method: method, Args: []any{a, map[string]any{"tracer": "callTracer"}}, Result: &raws[i]}
	}
	err := c.batch(ctx, method, elems)
	var rpcErr rpc.Error
	if errors.As(err, &rpcErr) && rpcErr.ErrorCode() == rpcMethodNotFound {
		return nil, ErrTracesUnsupported
	}
	if err != nil {
		return nil, err
	}
	var out []InternalTransfer
	for i, number := range numbers {
		found, err := ParseBlockTraces(raws[i], number)
		if err != nil {
			return nil, payment.Unavailable("chain "+method, fmt.Errorf("block %d: %w", number, err))
		}
		if hashes != nil {
			for j := range found {
				found[j].BlockHash = hashes[i]
			}
		}
		out = append(out, found...)
	}
	return out, nil
}

// ParseBlockTraces reads a callTracer answer of debug_traceBlockByNumber
// for block number: the internal transfers in it. A transaction whose own
// frame failed moved nothing; neither did a frame that failed or lies
// under one (its state was rolled back).
func ParseBlockTraces(raw json.RawMessage, number uint64) ([]InternalTransfer, error) {
	if len(raw) > traceBlockBytesMax {
		return nil, fmt.Errorf("trace answer of %d bytes, at most %d", len(raw), traceBlockBytesMax)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, ErrBlockNotFound
	}
	var txs []txTrace
	if err := json.Unmarshal(raw, &txs); err != nil {
		return nil, fmt.Errorf("decode traces: %w", err)
	}
	var (
		out  []InternalTransfer
		hash string
	)
	w := traceWalk{where: fmt.Sprintf("block %d", number), visit: transfersOf(func(t InternalTransfer) {
		t.TxHash, t.BlockNumber = hash, number
		out = append(out, t)
	})}
	for i, tx := range txs {
		if tx.TxHash == nil {
			return nil, fmt.Errorf("trace %d lacks txHash", i)
		}
		var err error
		if hash, err = parseHex(*tx.TxHash, hashHexLength, "traced transaction hash"); err != nil {
			return nil, err
		}
		if tx.Error != "" || tx.Result == nil {
			// The node could not trace it: the block is not read whole.
			return nil, fmt.Errorf("transaction %s not traced: %.200q", hash, tx.Error)
		}
		if err := w.frame(tx.Result, nil, 0, ""); err != nil {
			return nil, fmt.Errorf("transaction %s: %w", hash, err)
		}
	}
	return out, nil
}

// transfersOf is a traceWalk's visit that hands add each internal
// transfer: a CALL below the transaction's own frame that carries value
// and lies under no frame that failed.
func transfersOf(add func(InternalTransfer)) func(f *callFrame, typ string, path []int, failed string) error {
	return func(f *callFrame, typ string, path []int, failed string) error {
		if path == nil || failed != "" || typ != "CALL" {
			return nil
		}
		t, ok, err := internalTransfer(f, typ, path)
		if ok {
			add(t)
		}
		return err
	}
}

// traceWalk numbers a trace's frames the one way every reporter does and
// shows each to visit: its type in upper case, its path (nil: the
// transaction's own frame), and the error of the first frame on its way
// down that failed ("" if none did: what it moved stands).
type traceWalk struct {
	where  string // what is walked, for errors
	frames int
	visit  func(f *callFrame, typ string, path []int, failed string) error
}

// frame visits f at path and its children.
func (w *traceWalk) frame(f *callFrame, path []int, depth int, failed string) error {
	w.frames++
	if w.frames > traceFramesMax {
		return fmt.Errorf("more than %d call frames in %s", traceFramesMax, w.where)
	}
	if depth > traceDepthMax {
		return fmt.Errorf("call frames deeper than %d", traceDepthMax)
	}
	typ := strings.ToUpper(f.Type)
	if typ == "" || len(typ) > len("DELEGATECALL") {
		return fmt.Errorf("call frame type %.40q", f.Type)
	}
	if failed == "" && f.Error != "" {
		failed = cmp.Or(logging.Cut(f.Error, traceErrorShownMax), "failed")
	}
	if err := w.visit(f, typ, path, failed); err != nil {
		return err
	}
	index := 0
	for i := range f.Calls {
		child := &f.Calls[i]
		childType := strings.ToUpper(child.Type)
		if (childType == "CALL" || childType == "STATICCALL") && child.To != nil && precompile(strings.ToLower(*child.To)) {
			continue // no trace address, and a precompile has no subcalls
		}
		childPath := make([]int, len(path), len(path)+1)
		copy(childPath, path)
		if err := w.frame(child, append(childPath, index), depth+1, failed); err != nil {
			return err
		}
		index++
	}
	return nil
}

// frameValue is the value a frame carries (zero without a value field).
func frameValue(f *callFrame) (*big.Int, error) {
	if f.Value == nil {
		return new(big.Int), nil
	}
	if len(*f.Value) > traceValueHexMax {
		return nil, fmt.Errorf("call value %.80q is longer than a 256-bit word", *f.Value)
	}
	value, err := hexutil.DecodeBig(*f.Value)
	if err != nil {
		return nil, fmt.Errorf("call value %q: %w", *f.Value, err)
	}
	return value, nil
}

// traceAddressOf names a frame as Alchemy's typeTraceAddress does.
func traceAddressOf(typ string, path []int) string {
	var b strings.Builder
	b.WriteString(typ)
	for _, i := range path {
		b.WriteByte('_')
		b.WriteString(strconv.Itoa(i))
	}
	return b.String()
}

// internalTransfer is the transfer a CALL frame makes, if it carries value.
func internalTransfer(f *callFrame, typ string, path []int) (InternalTransfer, bool, error) {
	if f.Value == nil || f.To == nil {
		return InternalTransfer{}, false, nil // no value field: zero
	}
	value, err := frameValue(f)
	if err != nil {
		return InternalTransfer{}, false, err
	}
	if value.Sign() <= 0 {
		return InternalTransfer{}, false, nil
	}
	to, err := parseHex(*f.To, addressHexLength, "call recipient")
	if err != nil {
		return InternalTransfer{}, false, err
	}
	address := traceAddressOf(typ, path)
	if !payment.ValidTraceAddress(address) {
		// Deeper than a transfer index can name (about 45 levels): no
		// reporter's event can name it either (Alchemy's is refused as
		// malformed). Failing the block would stop the scan for good.
		return InternalTransfer{}, false, nil
	}
	return InternalTransfer{To: to, Value: value, TraceAddress: address}, true, nil
}

// TracedCall is the frame of one transaction's call trace that a trace
// address names, as the chain shows it.
type TracedCall struct {
	Type  string   // upper case: CALL, DELEGATECALL, STATICCALL, CREATE...
	To    string   // lowercase 0x; "" when the frame names none
	Value *big.Int // zero when it carries none
	// Failed is the error of the frame, or of the first frame above it,
	// that failed ("" when none did): what it moved was rolled back.
	Failed string
}

// parseTraceAddress splits a trace address ("call_0_1", either case) into
// its call type in upper case and its path. ok is false unless it names a
// frame below the transaction's own.
func parseTraceAddress(address string) (typ string, path []int, ok bool) {
	parts := strings.Split(address, "_")
	if len(parts) < 2 || len(parts) > traceDepthMax+1 || parts[0] == "" {
		return "", nil, false
	}
	for _, p := range parts[1:] {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || strconv.Itoa(n) != p {
			return "", nil, false
		}
		path = append(path, n)
	}
	return strings.ToUpper(parts[0]), path, true
}

// ParseTransactionTrace reads a callTracer answer of debug_traceTransaction
// and returns the frame at path, numbered as ParseBlockTraces numbers a
// block's (calls to precompiles take no place); found is false when the
// trace has no frame there.
func ParseTransactionTrace(raw json.RawMessage, path []int) (call TracedCall, found bool, err error) {
	top, err := decodeTransactionTrace(raw)
	if err != nil {
		return TracedCall{}, false, err
	}
	var at *callFrame
	w := traceWalk{where: "the transaction", visit: func(f *callFrame, typ string, p []int, failed string) error {
		if at == nil && p != nil && slices.Equal(p, path) {
			at, call.Type, call.Failed = f, typ, failed
		}
		return nil
	}}
	if err := w.frame(top, nil, 0, ""); err != nil {
		return TracedCall{}, false, err
	}
	if at == nil {
		return TracedCall{}, false, nil
	}
	if call.Value, err = frameValue(at); err != nil {
		return TracedCall{}, false, err
	}
	if at.To != nil {
		if call.To, err = parseHex(*at.To, addressHexLength, "call recipient"); err != nil {
			return TracedCall{}, false, err
		}
	}
	return call, true, nil
}

// ParseTransactionTransfers reads a callTracer answer of
// debug_traceTransaction: the internal transfers in it, numbered and
// chosen as ParseBlockTraces numbers and chooses a block's.
func ParseTransactionTransfers(raw json.RawMessage) ([]InternalTransfer, error) {
	top, err := decodeTransactionTrace(raw)
	if err != nil {
		return nil, err
	}
	var out []InternalTransfer
	w := traceWalk{where: "the transaction", visit: transfersOf(func(t InternalTransfer) { out = append(out, t) })}
	if err := w.frame(top, nil, 0, ""); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeTransactionTrace decodes one transaction's callTracer answer.
func decodeTransactionTrace(raw json.RawMessage) (*callFrame, error) {
	if len(raw) > traceBlockBytesMax {
		return nil, fmt.Errorf("trace answer of %d bytes, at most %d", len(raw), traceBlockBytesMax)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("no trace")
	}
	var top callFrame
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("decode trace: %w", err)
	}
	return &top, nil
}

// ProbeTxTraces asks debug_traceTransaction with the call tracer about a
// hash no transaction has: any answer but "no such method" says the
// endpoint serves it. ErrTxTraceUnsupported when it does not; any other
// error is an outage, which says nothing either way.
func (c *Client) ProbeTxTraces(ctx context.Context) error {
	var raw json.RawMessage
	err := c.call(ctx, MethodTraceTx, func(ctx context.Context) error {
		err := c.rpc.CallContext(ctx, &raw, MethodTraceTx, common.Hash{}.Hex(), map[string]any{"tracer": "callTracer"})
		var rpcErr rpc.Error
		if errors.As(err, &rpcErr) {
			if rpcErr.ErrorCode() == rpcMethodNotFound {
				return ErrTxTraceUnsupported
			}
			return nil // "transaction not found": the method is there
		}
		return err
	})
	if errors.Is(err, ErrTxTraceUnsupported) {
		return ErrTxTraceUnsupported
	}
	return err
}

// TracedCallAt traces one transaction with the call tracer
// (debug_traceTransaction) and returns the frame at path (see
// ParseTransactionTrace). A node without the debug API answers
// ErrTxTraceUnsupported.
func (c *Client) TracedCallAt(ctx context.Context, txHash string, path []int) (TracedCall, bool, error) {
	raw, err := c.traceTransaction(ctx, txHash)
	if err != nil {
		return TracedCall{}, false, err
	}
	call, found, err := ParseTransactionTrace(raw, path)
	if err != nil {
		return TracedCall{}, false, payment.Unavailable("chain "+MethodTraceTx, fmt.Errorf("transaction %s: %w", txHash, err))
	}
	return call, found, nil
}

// TxInternalTransfers traces one transaction with the call tracer and
// returns its internal transfers (see ParseTransactionTransfers). A node
// without the debug API answers ErrTxTraceUnsupported.
func (c *Client) TxInternalTransfers(ctx context.Context, txHash string) ([]InternalTransfer, error) {
	raw, err := c.traceTransaction(ctx, txHash)
	if err != nil {
		return nil, err
	}
	out, err := ParseTransactionTransfers(raw)
	if err != nil {
		return nil, payment.Unavailable("chain "+MethodTraceTx, fmt.Errorf("transaction %s: %w", txHash, err))
	}
	for i := range out {
		out[i].TxHash = txHash
	}
	return out, nil
}

// traceTransaction is debug_traceTransaction's callTracer answer for one
// transaction; ErrTxTraceUnsupported from a node without the debug API.
func (c *Client) traceTransaction(ctx context.Context, txHash string) (json.RawMessage, error) {
	var raw json.RawMessage
	err := c.call(ctx, MethodTraceTx, func(ctx context.Context) error {
		err := c.rpc.CallContext(ctx, &raw, MethodTraceTx, txHash, map[string]any{"tracer": "callTracer"})
		var rpcErr rpc.Error
		if errors.As(err, &rpcErr) && rpcErr.ErrorCode() == rpcMethodNotFound {
			return ErrTxTraceUnsupported
		}
		return err
	})
	if errors.Is(err, ErrTxTraceUnsupported) {
		return nil, ErrTxTraceUnsupported
	}
	return raw, err
}
