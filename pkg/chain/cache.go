package chain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// The seed's cache lifetimes: a transaction in a finalized block never
// changes again, so its receipt is kept a day; "not final yet" is only a
// hint that spares the node a question for a short while.
const (
	FinalTTLDefault    = 24 * time.Hour
	NotFinalTTLDefault = 30 * time.Second

	// cacheRedisTimeout bounds each cache round trip; past it the chain
	// is asked directly.
	cacheRedisTimeout = 500 * time.Millisecond
	// cachedTransfersMax: a receipt with more Transfer logs (a big batch
	// payout) is not cached, which bounds an entry's size.
	cachedTransfersMax = 256
	// finalRecordVersion tags the entry format; another version is a miss.
	// 3: entries are written only once the header at the receipt's height
	// confirmed its block; version 2 ones may hold a forked receipt.
	finalRecordVersion = 3
)

const (
	finalKeyPrefix    = "settle:chain:final:"
	notFinalKeyPrefix = "settle:chain:notfinal:"
)

// finalityCache remembers receipts in finalized blocks (safe: finality is
// irreversible) and, briefly, that a transaction was not final yet. Every
// failure is a miss: the caller then asks the chain.
type finalityCache struct {
	rdb         redis.UniversalClient // nil: no cache
	redis       *redisLatch           // skips the cache for a while after a Redis failure
	finalTTL    time.Duration
	notFinalTTL time.Duration // <= 0: no not-final hints
	metrics     *cacheMetrics
	// namespace keeps networks apart ("" or "<network>:").
	namespace string
}

// finalRecord is a cached receipt of a transaction in a finalized block.
type finalRecord struct {
	Version     int              `json:"v"`
	TxHash      string           `json:"tx_hash"`
	Status      uint64           `json:"status"`
	BlockNumber uint64           `json:"block_number"`
	BlockHash   string           `json:"block_hash"`
	Transfers   []transferRecord `json:"transfers,omitempty"`
	FirstLog    uint             `json:"first_log"`
	// The transaction's own recipient and value, once a native deposit
	// needed them; TxValue empty: not known.
	TxTo    string `json:"tx_to,omitempty"`
	TxValue string `json:"tx_value,omitempty"`
}

type transferRecord struct {
	Contract string `json:"contract"`
	From     string `json:"from"`
	To       string `json:"to"`
	Value    string `json:"value"` // decimal base units
	LogIndex uint   `json:"log_index"`
}

// notFinalRecord says where a transaction was mined when the policy did
// not hold yet.
type notFinalRecord struct {
	BlockNumber uint64 `json:"block_number"`
	BlockHash   string `json:"block_hash"`
}

func (c *finalityCache) enabled() bool { return c.rdb != nil && c.redis.usable() }

// final returns the cached receipt of a transaction known to be in a
// finalized block.
func (c *finalityCache) final(ctx context.Context, txHash string) (*Receipt, bool) {
	if !c.enabled() {
		return nil, false
	}
	raw, ok := c.get(ctx, finalKeyPrefix+c.namespace+txHash, "get_final")
	if !ok {
		return nil, false
	}
	r, err := decodeFinalRecord(raw, txHash)
	if err != nil {
		// Not ours or corrupt: ask the chain, whose answer overwrites it.
		c.metrics.lookups.WithLabelValues(cacheError).Inc()
		zerolog.Ctx(ctx).Warn().Err(err).Str("tx_hash", txHash).Msg("finality cache: unreadable entry ignored")
		return nil, false
	}
	c.metrics.lookups.WithLabelValues(cacheHitFinal).Inc()
	return r, true
}

func (c *finalityCache) putFinal(ctx context.Context, r *Receipt) {
	if !c.enabled() || len(r.Transfers) > cachedTransfersMax {
		return
	}
	raw, err := encodeFinalRecord(r)
	if err != nil {
		zerolog.Ctx(ctx).Error().Err(err).Str("tx_hash", r.TxHash).Msg("finality cache: encode receipt")
		return
	}
	c.set(ctx, finalKeyPrefix+c.namespace+r.TxHash, raw, c.finalTTL, "put_final")
}

// notFinal returns the hint that, under policy p, the transaction was
// mined but not yet final a moment ago.
func (c *finalityCache) notFinal(ctx context.Context, txHash string, p Policy) (notFinalRecord, bool) {
	if !c.enabled() || c.notFinalTTL <= 0 {
		return notFinalRecord{}, false
	}
	raw, ok := c.get(ctx, notFinalKey(c.namespace+txHash, p), "get_not_final")
	if !ok {
		return notFinalRecord{}, false
	}
	var rec notFinalRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		c.metrics.lookups.WithLabelValues(cacheError).Inc()
		return notFinalRecord{}, false
	}
	if blockHash, err := parseHex(rec.BlockHash, hashHexLength, "block hash"); err != nil || blockHash != rec.BlockHash {
		c.metrics.lookups.WithLabelValues(cacheError).Inc()
		return notFinalRecord{}, false
	}
	c.metrics.lookups.WithLabelValues(cacheHitNotFinal).Inc()
	return rec, true
}

func (c *finalityCache) putNotFinal(ctx context.Context, txHash string, p Policy, rec notFinalRecord) {
	if !c.enabled() || c.notFinalTTL <= 0 {
		return
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		zerolog.Ctx(ctx).Error().Err(err).Msg("finality cache: encode hint")
		return
	}
	c.set(ctx, notFinalKey(c.namespace+txHash, p), raw, c.notFinalTTL, "put_not_final")
}

func notFinalKey(txHash string, p Policy) string {
	return notFinalKeyPrefix + p.String() + ":" + txHash
}

// get reads a key; a miss and an error both say "ask the chain".
func (c *finalityCache) get(ctx context.Context, key, op string) ([]byte, bool) {
	redisCtx, cancel := context.WithTimeout(ctx, cacheRedisTimeout)
	defer cancel()
	raw, err := c.rdb.Get(redisCtx, key).Bytes()
	switch {
	case err == nil:
		return raw, true
	case errors.Is(err, redis.Nil):
		c.metrics.lookups.WithLabelValues(cacheMiss).Inc()
	default:
		c.metrics.lookups.WithLabelValues(cacheError).Inc()
		c.failed(ctx, op, err)
	}
	return nil, false
}

func (c *finalityCache) set(ctx context.Context, key string, raw []byte, ttl time.Duration, op string) {
	redisCtx, cancel := context.WithTimeout(ctx, cacheRedisTimeout)
	defer cancel()
	if err := c.rdb.Set(redisCtx, key, raw, ttl).Err(); err != nil {
		c.failed(ctx, op, err)
	}
}

func (c *finalityCache) failed(ctx context.Context, op string, err error) {
	if ctx.Err() != nil {
		return // the caller gave up; Redis is not to blame
	}
	c.metrics.redisFailure.WithLabelValues(op).Inc()
	c.redis.failed()
	zerolog.Ctx(ctx).Warn().Err(err).Str("op", op).Str("retry_after", c.redis.period.String()).
		Msg("finality cache unreachable; asking the chain directly")
}

func encodeFinalRecord(r *Receipt) ([]byte, error) {
	rec := finalRecord{
		Version: finalRecordVersion, TxHash: r.TxHash, Status: r.Status,
		BlockNumber: r.BlockNumber, BlockHash: r.BlockHash, FirstLog: r.FirstLogIndex,
	}
	if r.TxValue != nil {
		rec.TxTo, rec.TxValue = r.TxTo, r.TxValue.String()
	}
	for _, t := range r.Transfers {
		rec.Transfers = append(rec.Transfers, transferRecord{
			Contract: t.Contract, From: t.From, To: t.To, Value: t.Value.String(), LogIndex: t.LogIndex,
		})
	}
	return json.Marshal(rec)
}

// decodeFinalRecord checks every field: a cached receipt can credit money,
// so an entry that is not exactly what encodeFinalRecord wrote for this
// transaction is refused.
func decodeFinalRecord(raw []byte, txHash string) (*Receipt, error) {
	var rec finalRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if rec.Version != finalRecordVersion {
		return nil, fmt.Errorf("entry version %d, want %d", rec.Version, finalRecordVersion)
	}
	if rec.TxHash != txHash {
		return nil, fmt.Errorf("entry is for transaction %q", rec.TxHash)
	}
	if rec.Status > 1 {
		return nil, fmt.Errorf("status %d", rec.Status)
	}
	if len(rec.Transfers) > cachedTransfersMax {
		return nil, fmt.Errorf("%d transfers", len(rec.Transfers))
	}
	blockHash, err := parseHex(rec.BlockHash, hashHexLength, "block hash")
	if err != nil || blockHash != rec.BlockHash {
		return nil, fmt.Errorf("block hash %q", rec.BlockHash)
	}
	r := &Receipt{TxHash: txHash, Status: rec.Status, BlockNumber: rec.BlockNumber, BlockHash: blockHash, FirstLogIndex: rec.FirstLog}
	if rec.TxValue != "" {
		if r.TxValue, err = decodeValue(rec.TxValue); err != nil {
			return nil, fmt.Errorf("transaction value %q", rec.TxValue)
		}
		if rec.TxTo != "" {
			if r.TxTo, err = parseHex(rec.TxTo, addressHexLength, "address"); err != nil || r.TxTo != rec.TxTo {
				return nil, fmt.Errorf("transaction recipient %q", rec.TxTo)
			}
		}
	} else if rec.TxTo != "" {
		return nil, fmt.Errorf("transaction recipient without a value")
	}
	for _, t := range rec.Transfers {
		transfer, err := decodeTransferRecord(t)
		if err != nil {
			return nil, err
		}
		r.Transfers = append(r.Transfers, transfer)
	}
	return r, nil
}

func decodeTransferRecord(t transferRecord) (Transfer, error) {
	out := Transfer{LogIndex: t.LogIndex}
	for _, field := range []struct {
		in  string
		out *string
	}{{t.Contract, &out.Contract}, {t.From, &out.From}, {t.To, &out.To}} {
		address, err := parseHex(field.in, addressHexLength, "address")
		if err != nil || address != field.in {
			return Transfer{}, fmt.Errorf("transfer address %q", field.in)
		}
		*field.out = address
	}
	value, err := decodeValue(t.Value)
	if err != nil {
		return Transfer{}, fmt.Errorf("transfer value %q", t.Value)
	}
	out.Value = value
	return out, nil
}

// decodeValue reads a uint256 written in decimal, in its one canonical form.
func decodeValue(s string) (*big.Int, error) {
	value, ok := new(big.Int).SetString(s, 10)
	if !ok || value.Sign() < 0 || value.BitLen() > 256 || value.String() != s {
		return nil, fmt.Errorf("value %q is not a canonical uint256", s)
	}
	return value, nil
}
