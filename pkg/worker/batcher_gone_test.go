package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/worker"
)

// countingLedger is the real ledger, counting the transactions it is
// asked for.
type countingLedger struct {
	*postgres.DB
	batches atomic.Int32
}

func (c *countingLedger) ApplyBatch(ctx context.Context, items []postgres.LedgerItem, o postgres.LedgerOptions) ([]postgres.LedgerResult, error) {
	c.batches.Add(1)
	return c.DB.ApplyBatch(ctx, items, o)
}

// ledgerItems accepts and claims one deposit per user, as tasks carry them.
func ledgerItems(t *testing.T, p *pipeline, prefix string, users int64) []postgres.LedgerItem {
	t.Helper()
	for u := int64(1); u <= users; u++ {
		p.accept(fmt.Sprintf("%s-%d", prefix, u), payment.Deposit, u, "ETH", "1")
	}
	claimed, err := p.db.ClaimOutbox(context.Background(), int(users), 0, 32)
	require.NoError(t, err)
	require.Len(t, claimed, int(users))
	items := make([]postgres.LedgerItem, len(claimed))
	for i, c := range claimed {
		items[i] = postgres.LedgerItem{Event: c.Event}
	}
	return items
}

// TestLedgerSkipsCallsWhoseCallerLeft: a task that stopped waiting for the
// ledger (its wait ran out behind a stuck batch) has retried as an
// outage; its call, still queued, is not committed when its turn comes,
// so the copies of a long lock's retries do not pile up in the ledger.
func TestLedgerSkipsCallsWhoseCallerLeft(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	p.user(1, map[string]string{"ETH": "10"})
	p.user(2, map[string]string{"ETH": "10"})
	p.user(3, map[string]string{"ETH": "10"})
	ledger := &countingLedger{DB: p.db}
	batcher := worker.NewBatcher(ledger, postgres.LedgerOptions{LockTimeout: 5 * time.Second}, 32, 1, prometheus.NewRegistry())
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	go batcher.Run(bctx)
	items := ledgerItems(t, p, "gone", 3)

	holder, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id = 1 FOR UPDATE`)
	require.NoError(t, err)

	first := make(chan error, 1)
	go func() {
		_, err := batcher.Submit(ctx, items[0])
		first <- err
	}()
	require.Eventually(t, func() bool { return ledger.batches.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "the first batch waits on the lock")
	wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = batcher.Submit(wait, items[1])
	cancel()
	require.ErrorIs(t, err, payment.ErrUnavailable, "a wait cut by its deadline is an outage")

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-first)
	// A call queued after the one whose caller left: once it is answered,
	// the engine has had its turn at the other.
	_, err = batcher.Submit(ctx, items[2])
	require.NoError(t, err)
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'gone-3' AND status = 'confirmed'`))
	require.Equal(t, 1, p.count(`SELECT count(*) FROM payment_events WHERE event_id = 'gone-2' AND status = 'enqueued'`),
		"the call whose caller left was committed anyway")
	require.Equal(t, int32(2), ledger.batches.Load(), "a transaction for the call whose caller left")
}

// TestLedgerOutageEndsTheSplit: a batch refused by a lock timeout is split
// by user; when the first user's transaction meets an outage (its
// statements, prepared again, wait on a table lock for the batch's whole
// bound), the other users' are not tried one after another, each waiting
// as long.
func TestLedgerOutageEndsTheSplit(t *testing.T) {
	ctx := context.Background()
	p := newPipeline(t, pipelineOptions{noWorker: true, noEnqueuer: true})
	const users = 4
	for u := int64(1); u <= users; u++ {
		p.user(u, map[string]string{"ETH": "10"})
	}
	ledgerDB, err := postgres.Open(ctx, p.dsn, postgres.Options{ConnsMax: 1, ApplicationName: "settle-test-ledger"})
	require.NoError(t, err)
	defer ledgerDB.Close()
	ledger := &countingLedger{DB: ledgerDB}
	batcher := worker.NewBatcher(ledger, postgres.LedgerOptions{LockTimeout: 100 * time.Millisecond}, 32, 1, prometheus.NewRegistry())
	batcher.BoundBatches(time.Second)
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	go batcher.Run(bctx)
	// Warm the one connection, as a running worker's is.
	_, errs := batcher.SubmitAll(ctx, ledgerItems(t, p, "warm", users))
	require.NoError(t, errors.Join(errs...))
	warm := ledger.batches.Load()

	holder, err := pgx.Connect(ctx, p.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE balances IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	items := ledgerItems(t, p, "split", users)
	_, errs = batcher.SubmitAll(ctx, items)
	require.NoError(t, tx.Rollback(ctx))
	for i, err := range errs {
		require.Error(t, err, "item %d settled under the lock", i)
	}
	require.ErrorIs(t, errs[users-1], payment.ErrUnavailable, "the last user's events end with the outage")
	require.LessOrEqual(t, ledger.batches.Load()-warm, int32(2), "the batch, then one user's transaction: the outage ends the split")
}
