//go:build !fuzzing

package chain

import (
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/testenv"
)

// TestFinalityCacheSparesTheNode: once a transaction is known final, a
// second worker sharing the Redis decides it, and the reorg watcher
// confirms it, without a single RPC request; "not final yet" is believed
// for NotFinalTTL without asking either.
func TestFinalityCacheSparesTheNode(t *testing.T) {
	c := startChain(t)
	p := newProxy(t, c.URL())
	redisURL := testenv.RedisURL(t)
	opts := workerOptions{redisURL: redisURL, notFinalTTL: time.Hour}
	a, b := newWorker(t, p.URL(), opts), newWorker(t, p.URL(), opts)
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)

	v := check(t, a, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, Wait, v.State)
	before := p.requests.Load()
	hinted := check(t, b, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, before, p.requests.Load(), "the not-final hint answered")
	require.Equal(t, Wait, hinted.State)
	require.True(t, hinted.ReceiptSeen)
	require.Equal(t, tx.BlockHash, hinted.BlockHash)

	// The hint belongs to its policy: under none the chain is asked.
	require.Equal(t, Credit, check(t, b, ethDeposit(tx, to), NonePolicy()).State)
	require.Greater(t, p.requests.Load(), before)

	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	_, err = a.rdb.Del(ctx, notFinalKey(tx.Hash, FinalizedPolicy())).Result() // as if its 30s had passed
	require.NoError(t, err)
	credited := check(t, a, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, Credit, credited.State)

	before = p.requests.Load()
	require.Equal(t, credited, check(t, b, ethDeposit(tx, to), FinalizedPolicy()))
	underNone := check(t, b, ethDeposit(tx, to), NonePolicy())
	require.Equal(t, Credit, underNone.State)
	require.True(t, underNone.Finalized)
	seen, err := b.checker.StillCanonical(ctx, ethDeposit(tx, to), tx.BlockNumber, tx.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Final, seen.State)
	require.Equal(t, before, p.requests.Load(), "the final cache answered")

	// confirmations:N still needs the head, and nothing else.
	require.Equal(t, Credit, check(t, b, ethDeposit(tx, to), mustPolicy(t, "confirmations:1")).State)
	require.Equal(t, before+1, p.requests.Load())

	ttl, err := a.rdb.TTL(ctx, finalKeyPrefix+tx.Hash).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, FinalTTLDefault-time.Minute)
	require.LessOrEqual(t, ttl, FinalTTLDefault)
}

// TestFinalityCacheRefusesBadEntries: an entry that is not exactly what
// this package wrote for this transaction is ignored, never believed.
func TestFinalityCacheRefusesBadEntries(t *testing.T) {
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: testenv.RedisURL(t)})
	ctx := testContext(t)
	to := c.Accounts()[1].Address
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)

	other := "0x" + strings.Repeat("99", 32)
	forged, err := encodeFinalRecord(&Receipt{TxHash: other, Status: 1, BlockNumber: tx.BlockNumber, BlockHash: tx.BlockHash})
	require.NoError(t, err)
	// A record of the right transaction whose native value fields are not
	// in canonical form.
	base := `{"v":` + itoa(finalRecordVersion) + `,"tx_hash":"` + tx.Hash + `","status":1,"block_number":` + itoa(tx.BlockNumber) + `,"block_hash":"` + tx.BlockHash + `"`
	badValues := [][]byte{
		[]byte(base + `,"tx_to":"` + strings.ToLower(to) + `"}`),
		[]byte(base + `,"tx_to":"` + strings.ToLower(to) + `","tx_value":"01"}`),
		[]byte(base + `,"tx_to":"` + strings.ToUpper(to) + `","tx_value":"1"}`),
		[]byte(base + `,"tx_to":"` + strings.ToLower(to) + `","tx_value":"-1"}`),
	}
	for _, raw := range append([][]byte{[]byte("garbage"), []byte(`{"v":1}`), []byte(`{"v":2}`), []byte(`{"v":4}`), forged}, badValues...) {
		require.NoError(t, w.rdb.Set(ctx, finalKeyPrefix+tx.Hash, raw, time.Hour).Err())
		v := check(t, w, ethDeposit(tx, to), FinalizedPolicy())
		require.Equal(t, Wait, v.State, "the chain says not final")
	}
	// The control: the same record in canonical form is believed, and its
	// value decides the deposit.
	good := []byte(base + `,"tx_to":"` + strings.ToLower(to) + `","tx_value":"2"}`)
	require.NoError(t, w.rdb.Set(ctx, finalKeyPrefix+tx.Hash, good, time.Hour).Err())
	v := check(t, w, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, Mismatch, v.State)
	require.Equal(t, "the transaction carries 2 base units, the deposit says 1", v.Reason)
}

// TestBrokenRedisStillAnswersCorrectly: with Redis gone, deposits are
// decided by asking the chain, with the same answers.
func TestBrokenRedisStillAnswersCorrectly(t *testing.T) {
	ctx := testContext(t)
	rds, err := devenv.StartRedis(ctx, devenv.RedisOptions{})
	require.NoError(t, err)
	t.Cleanup(rds.Close)
	c := startChain(t)
	w := newWorker(t, c.URL(), workerOptions{redisURL: rds.URL(0), notFinalTTL: time.Hour, breaker: BreakerSettings{RedisRetryAfter: 50 * time.Millisecond}})
	to := c.Accounts()[1].Address
	tx, err := c.SendETH(ctx, 0, to, big.NewInt(1))
	require.NoError(t, err)
	require.Equal(t, Wait, check(t, w, ethDeposit(tx, to), FinalizedPolicy()).State)

	rds.Stop()
	require.NoError(t, c.FinalizeThrough(ctx, tx.BlockNumber))
	// The hint stored before Redis died is gone with it: the chain answers.
	v := check(t, w, ethDeposit(tx, to), FinalizedPolicy())
	require.Equal(t, Credit, v.State)
	require.True(t, v.Finalized)
	seen, err := w.checker.StillCanonical(ctx, ethDeposit(tx, to), tx.BlockNumber, tx.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Final, seen.State)
	require.Positive(t, metricValue(t, w.checker.cache.metrics.redisFailure.WithLabelValues("get_final")))

	_, err = c.Reorg(ctx, "0x"+strings.Repeat("00", 32))
	require.Error(t, err, "no such transaction")
	require.Equal(t, Wait, check(t, w, ethDeposit(devchain.Tx{Hash: "0x" + strings.Repeat("ab", 32)}, to), FinalizedPolicy()).State)
}
