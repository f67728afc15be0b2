package chain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/settle/settle/pkg/payment"
)

// Bounds of the scanner's calls. A batch is one HTTP request (one breaker
// call) carrying that many JSON-RPC calls; providers bill each of them.
const (
	// ScanBatchMax bounds the blocks or receipts asked in one batch.
	ScanBatchMax = 50
	// ScanTopicsMax bounds the recipients of one eth_getLogs: geth refuses
	// more than 1,000 alternatives per topic position.
	ScanTopicsMax = 1000
	// ScanContractsMax bounds the token contracts of one eth_getLogs.
	ScanContractsMax = 1000
)

// RPC method names of the scanner, as metric labels.
const (
	MethodLogs       = "eth_getLogs"
	MethodBlock      = methodBlock
	MethodReceipt    = methodReceipt
	MethodTraceBlock = "debug_traceBlockByNumber"
	// MethodTraceBlockByHash traces the very block a pass read (see
	// InternalTransfersAt).
	MethodTraceBlockByHash = "debug_traceBlockByHash"
	// MethodTraceTx is the checker's, for an internal deposit.
	MethodTraceTx = "debug_traceTransaction"
)

// ErrLogsLimit: the node refused an eth_getLogs as too large (too many
// results, too wide a range, too slow) or answered more logs than the
// caller's cap. Not an outage: the same question over fewer blocks is
// answered.
var ErrLogsLimit = errors.New("eth_getLogs answer over a limit")

// ErrTracesUnsupported: the endpoint does not serve debug_traceBlockByNumber
// (or debug_traceBlockByHash, where asked).
var ErrTracesUnsupported = errors.New("the endpoint does not serve debug_traceBlockByNumber or debug_traceBlockByHash (SCAN_TRACES=on needs a node with the debug API)")

// TransferLog is an ERC-20 Transfer log found by a scan.
type TransferLog struct {
	Transfer
	TxHash      string
	BlockNumber uint64
	// BlockHash names the block the node read the log from ("" if it sent
	// none): behind a balancer, maybe not the block a pass read there.
	BlockHash string
}

// BlockTx is a transaction's own value movement.
type BlockTx struct {
	Hash  string
	To    string // lowercase; empty for a contract creation
	Value *big.Int
}

// Block is a block's number and its transactions.
type Block struct {
	Number uint64
	Hash   string
	// ParentHash links the block to the one below it ("" if the node
	// sent none), so a scan can tell its reads are one chain.
	ParentHash   string
	Transactions []BlockTx
	// Bloom is the block's logsBloom; HasBloom is false when the node
	// sent none (then nothing can be told from it).
	Bloom    types.Bloom
	HasBloom bool
}

// MayHoldTransfer tells whether the block's logs bloom admits a Transfer
// log of contract, to one of recipients when any are given. A bloom has
// false positives but no false negatives: false means no such log. A
// block without a bloom may hold anything.
func (b Block) MayHoldTransfer(contract string, recipients []string) bool {
	if !b.HasBloom {
		return true
	}
	if !b.Bloom.Test(common.HexToAddress(contract).Bytes()) || !b.Bloom.Test(transferTopic.Bytes()) {
		return false
	}
	if len(recipients) == 0 {
		return true
	}
	for _, r := range recipients {
		if b.Bloom.Test(common.BytesToHash(common.HexToAddress(r).Bytes()).Bytes()) {
			return true
		}
	}
	return false
}

// FinalityHead is the highest block deposits may be credited in under p:
// the finalized block, the head less N under confirmations:N (the
// contract's head − N: one block short of the worker's credit rule, where
// the head is the Nth confirmation, so a reorg of N blocks never rewrites
// a block already scanned), or the head under none. ok is false while no
// block qualifies.
func (c *Client) FinalityHead(ctx context.Context, p Policy) (head uint64, ok bool, err error) {
	switch p.Kind() {
	case Finalized:
		h, err := c.HeaderByTag(ctx, TagFinalized)
		if errors.Is(err, ErrBlockNotFound) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, err
		}
		return h.Number, true, nil
	case Confirmations, None:
		h, err := c.HeaderByTag(ctx, TagLatest)
		if err != nil {
			return 0, false, err
		}
		behind := p.Confirmations() // 0 under none
		if h.Number < behind {
			return 0, false, nil
		}
		return h.Number - behind, true, nil
	}
	return 0, false, payment.Invalid("deposit finality policy is not set")
}

// TransferLogs asks eth_getLogs for the Transfer logs of contracts to
// recipients in blocks from through to (both lowercase 0x addresses;
// at most ScanContractsMax and ScanTopicsMax). Removed logs are left out.
// ErrLogsLimit: the node refused the range as too large; ask for fewer
// blocks.
func (c *Client) TransferLogs(ctx context.Context, from, to uint64, contracts, recipients []string) ([]TransferLog, error) {
	if len(contracts) == 0 || len(recipients) == 0 {
		return nil, nil
	}
	if len(contracts) > ScanContractsMax || len(recipients) > ScanTopicsMax || from > to {
		return nil, payment.Invalid("eth_getLogs over %d contracts and %d recipients in blocks %d..%d is out of bounds", len(contracts), len(recipients), from, to)
	}
	q := transferQuery(from, to, contracts)
	q.Topics = append(q.Topics, nil, make([]common.Hash, len(recipients)))
	for i, r := range recipients {
		q.Topics[2][i] = common.BytesToHash(common.HexToAddress(r).Bytes())
	}
	return c.filterTransfers(ctx, q, 0)
}

// ContractTransferLogs asks eth_getLogs for every Transfer log of
// contracts in blocks from through to, whoever received it: one call
// whatever the number of registered addresses, the recipients matched by
// the caller. An answer of more than logsMax logs is ErrLogsLimit, as is a
// node's refusal of the range as too large: ask for fewer blocks.
func (c *Client) ContractTransferLogs(ctx context.Context, from, to uint64, contracts []string, logsMax int) ([]TransferLog, error) {
	if len(contracts) == 0 {
		return nil, nil
	}
	if len(contracts) > ScanContractsMax || from > to || logsMax <= 0 {
		return nil, payment.Invalid("eth_getLogs over %d contracts in blocks %d..%d with at most %d logs is out of bounds", len(contracts), from, to, logsMax)
	}
	return c.filterTransfers(ctx, transferQuery(from, to, contracts), logsMax)
}

// TransferLogsAt asks eth_getLogs for every Transfer log of contracts in
// the block of that hash (EIP-234): a node that lacks the block answers an
// error, never an empty list, so the answer is the block's own. An answer
// of more than logsMax logs, or a node's refusal, is ErrLogsLimit.
func (c *Client) TransferLogsAt(ctx context.Context, blockHash string, contracts []string, logsMax int) ([]TransferLog, error) {
	if len(contracts) == 0 {
		return nil, nil
	}
	hash, err := parseHex(blockHash, hashHexLength, "block hash")
	if err != nil || len(contracts) > ScanContractsMax || logsMax <= 0 {
		return nil, payment.Invalid("eth_getLogs over %d contracts in block %q with at most %d logs is out of bounds", len(contracts), blockHash, logsMax)
	}
	h := common.HexToHash(hash)
	q := ethereum.FilterQuery{BlockHash: &h, Topics: [][]common.Hash{{transferTopic}}}
	for _, a := range contracts {
		q.Addresses = append(q.Addresses, common.HexToAddress(a))
	}
	return c.filterTransfers(ctx, q, logsMax)
}

// transferQuery asks for the Transfer logs of contracts in from..to.
func transferQuery(from, to uint64, contracts []string) ethereum.FilterQuery {
	q := ethereum.FilterQuery{
		FromBlock: new(big.Int).SetUint64(from),
		ToBlock:   new(big.Int).SetUint64(to),
		Topics:    [][]common.Hash{{transferTopic}},
	}
	for _, a := range contracts {
		q.Addresses = append(q.Addresses, common.HexToAddress(a))
	}
	return q
}

// filterTransfers runs q and keeps its well-formed ERC-20 Transfers;
// logsMax > 0 caps the answer. A limit refusal is an answer (the node is
// up and said what it serves), so the breaker counts it as a success:
// shrinking windows must never open the breaker the worker shares.
func (c *Client) filterTransfers(ctx context.Context, q ethereum.FilterQuery, logsMax int) ([]TransferLog, error) {
	var out []TransferLog
	var limit error
	err := c.call(ctx, MethodLogs, func(ctx context.Context) error {
		logs, err := c.eth.FilterLogs(ctx, q)
		if reason, ok := logsLimitError(err, c.redact); ok {
			limit = fmt.Errorf("%w: %s", ErrLogsLimit, reason)
			return nil
		}
		if err != nil {
			return err
		}
		if logsMax > 0 && len(logs) > logsMax {
			limit = fmt.Errorf("%w: %d logs, more than SCAN_LOGS_MAX=%d", ErrLogsLimit, len(logs), logsMax)
			return nil
		}
		out = out[:0]
		for _, l := range logs {
			if l.Removed || len(l.Topics) != 3 || l.Topics[0] != transferTopic {
				continue
			}
			fromAddr, okFrom := topicAddress([32]byte(l.Topics[1]))
			toAddr, okTo := topicAddress([32]byte(l.Topics[2]))
			value, okValue := wordValue(l.Data)
			if !okFrom || !okTo || !okValue {
				continue
			}
			tl := TransferLog{
				Transfer: Transfer{Contract: strings.ToLower(l.Address.Hex()), From: fromAddr, To: toAddr, Value: value, LogIndex: l.Index},
				TxHash:   strings.ToLower(l.TxHash.Hex()), BlockNumber: l.BlockNumber,
			}
			if l.BlockHash != (common.Hash{}) {
				tl.BlockHash = strings.ToLower(l.BlockHash.Hex())
			}
			out = append(out, tl)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if limit != nil {
		return nil, limit
	}
	return out, nil
}

// fullBlockJSON is the part of eth_getBlockByNumber(n, true) we read.
type fullBlockJSON struct {
	Number       *string      `json:"number"`
	Hash         *string      `json:"hash"`
	ParentHash   *string      `json:"parentHash"`
	LogsBloom    *types.Bloom `json:"logsBloom"`
	Transactions []struct {
		Hash  *string `json:"hash"`
		To    *string `json:"to"`
		Value *string `json:"value"`
	} `json:"transactions"`
}

// Blocks reads blocks with their transactions in one batch (at most
// ScanBatchMax). A block the node does not have is an error: the scanner
// asks only for blocks at or below a head the node reported.
func (c *Client) Blocks(ctx context.Context, numbers []uint64) ([]Block, error) {
	if len(numbers) > ScanBatchMax {
		return nil, payment.Invalid("%d blocks in one batch, at most %d", len(numbers), ScanBatchMax)
	}
	raws := make([]json.RawMessage, len(numbers))
	elems := make([]rpc.BatchElem, len(numbers))
	for i, n := range numbers {
		elems[i] = rpc.BatchElem{Method: MethodBlock, Args: []any{hexutil.EncodeUint64(n), true}, Result: &raws[i]}
	}
	if err := c.batch(ctx, MethodBlock, elems); err != nil {
		return nil, err
	}
	out := make([]Block, len(numbers))
	for i, number := range numbers {
		b, err := parseFullBlock(raws[i])
		if err == nil && b.Number != number {
			err = fmt.Errorf("asked for block %d, the node answered block %d", number, b.Number)
		}
		if err != nil {
			return nil, payment.Unavailable("chain "+MethodBlock, err)
		}
		out[i] = b
	}
	return out, nil
}

func parseFullBlock(raw json.RawMessage) (Block, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return Block{}, ErrBlockNotFound
	}
	var b fullBlockJSON
	if err := json.Unmarshal(raw, &b); err != nil {
		return Block{}, fmt.Errorf("decode block: %w", err)
	}
	if b.Number == nil || b.Hash == nil {
		return Block{}, errors.New("block lacks number or hash")
	}
	var out Block
	var err error
	if out.Number, err = parseQuantity(*b.Number); err != nil {
		return Block{}, fmt.Errorf("block number: %w", err)
	}
	if out.Hash, err = parseHex(*b.Hash, hashHexLength, "block hash"); err != nil {
		return Block{}, err
	}
	if b.ParentHash != nil {
		if out.ParentHash, err = parseHex(*b.ParentHash, hashHexLength, "parent hash"); err != nil {
			return Block{}, err
		}
	}
	if b.LogsBloom != nil {
		out.Bloom, out.HasBloom = *b.LogsBloom, true
	}
	for _, t := range b.Transactions {
		if t.Hash == nil || t.Value == nil {
			return Block{}, errors.New("block transaction lacks hash or value (asked with full transactions)")
		}
		tx := BlockTx{}
		if tx.Hash, err = parseHex(*t.Hash, hashHexLength, "transaction hash"); err != nil {
			return Block{}, err
		}
		if tx.Value, err = hexutil.DecodeBig(*t.Value); err != nil {
			return Block{}, fmt.Errorf("transaction value %q: %w", *t.Value, err)
		}
		if t.To != nil {
			if tx.To, err = parseHex(*t.To, addressHexLength, "transaction recipient"); err != nil {
				return Block{}, err
			}
		}
		out.Transactions = append(out.Transactions, tx)
	}
	return out, nil
}

// receiptStatusJSON is the part of a receipt the scanner reads.
type receiptStatusJSON struct {
	TransactionHash *string `json:"transactionHash"`
	BlockHash       *string `json:"blockHash"`
	BlockNumber     *string `json:"blockNumber"`
	Status          *string `json:"status"`
}

// MinedTx is a transaction as a pass read it: in the block of that hash
// (a trace names no hash: then by number alone).
type MinedTx struct {
	Hash        string
	BlockHash   string
	BlockNumber uint64
}

// ReceiptStatuses reads the status (1 success, 0 reverted) of mined
// transactions in one batch (at most ScanBatchMax). A receipt from
// another block than the pass read is unavailable, never a status: a
// backend on another fork could call a paying transaction reverted there
// (under confirmations or none), and the pass would pass it for good.
func (c *Client) ReceiptStatuses(ctx context.Context, txs []MinedTx) (map[string]uint64, error) {
	if len(txs) == 0 {
		return map[string]uint64{}, nil
	}
	if len(txs) > ScanBatchMax {
		return nil, payment.Invalid("%d receipts in one batch, at most %d", len(txs), ScanBatchMax)
	}
	raws := make([]json.RawMessage, len(txs))
	elems := make([]rpc.BatchElem, len(txs))
	for i, tx := range txs {
		elems[i] = rpc.BatchElem{Method: MethodReceipt, Args: []any{tx.Hash}, Result: &raws[i]}
	}
	if err := c.batch(ctx, MethodReceipt, elems); err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(txs))
	for i, tx := range txs {
		status, err := receiptStatus(raws[i], tx)
		if err != nil {
			return nil, payment.Unavailable("chain "+MethodReceipt, err)
		}
		out[tx.Hash] = status
	}
	return out, nil
}

// receiptStatus reads one answer of ReceiptStatuses' batch.
func receiptStatus(raw json.RawMessage, tx MinedTx) (uint64, error) {
	var r receiptStatusJSON
	if len(raw) == 0 || string(raw) == "null" {
		return 0, fmt.Errorf("no receipt for %s, though its block was read", tx.Hash)
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Status == nil || r.TransactionHash == nil || !strings.EqualFold(*r.TransactionHash, tx.Hash) ||
		r.BlockHash == nil || r.BlockNumber == nil {
		return 0, fmt.Errorf("malformed receipt for %s", tx.Hash)
	}
	number, err := parseQuantity(*r.BlockNumber)
	if err != nil {
		return 0, fmt.Errorf("receipt block number of %s: %w", tx.Hash, err)
	}
	if number != tx.BlockNumber || (tx.BlockHash != "" && !strings.EqualFold(*r.BlockHash, tx.BlockHash)) {
		return 0, fmt.Errorf("%w: %s in block %d %s, read in block %d %s", ErrOtherFork, tx.Hash, number, *r.BlockHash, tx.BlockNumber, cmp.Or(tx.BlockHash, "(by number)"))
	}
	status, err := parseQuantity(*r.Status)
	if err != nil {
		return 0, fmt.Errorf("receipt status of %s: %w", tx.Hash, err)
	}
	return status, nil
}

// ProbeTraces asks debug_traceBlockByNumber about the latest block with
// the call tracer, and with byHash debug_traceBlockByHash too (about a
// hash no block has: any answer but "no such method" says it is served):
// ErrTracesUnsupported when the endpoint does not serve them.
func (c *Client) ProbeTraces(ctx context.Context, byHash bool) error {
	var raw json.RawMessage
	err := c.call(ctx, MethodTraceBlock, func(ctx context.Context) error {
		err := c.rpc.CallContext(ctx, &raw, MethodTraceBlock, "latest", map[string]any{"tracer": "callTracer"})
		var rpcErr rpc.Error
		if errors.As(err, &rpcErr) && rpcErr.ErrorCode() == rpcMethodNotFound {
			return ErrTracesUnsupported
		}
		return err
	})
	if err == nil && byHash {
		err = c.call(ctx, MethodTraceBlockByHash, func(ctx context.Context) error {
			err := c.rpc.CallContext(ctx, &raw, MethodTraceBlockByHash, common.Hash{}.Hex(), map[string]any{"tracer": "callTracer"})
			var rpcErr rpc.Error
			if errors.As(err, &rpcErr) {
				if rpcErr.ErrorCode() == rpcMethodNotFound {
					return ErrTracesUnsupported
				}
				return nil // "block not found": the method is there
			}
			return err
		})
	}
	if errors.Is(err, ErrTracesUnsupported) {
		return ErrTracesUnsupported
	}
	return err
}

// rpcMethodNotFound is JSON-RPC's code for a method the server lacks.
const rpcMethodNotFound = -32601

// batch sends elems as one request under the breaker; an element's own
// error fails the batch. Each element counts as a call.
func (c *Client) batch(ctx context.Context, method string, elems []rpc.BatchElem) error {
	if len(elems) == 0 {
		return nil
	}
	err := c.call(ctx, method, func(ctx context.Context) error {
		if err := c.rpc.BatchCallContext(ctx, elems); err != nil {
			return err
		}
		for _, e := range elems {
			if e.Error != nil {
				return e.Error
			}
		}
		return nil
	})
	c.metrics.calls.WithLabelValues(method).Add(float64(len(elems) - 1))
	return err
}
