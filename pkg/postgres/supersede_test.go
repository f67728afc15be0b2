package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// providerDeposit is a transfer-identity deposit of user for amount ETH
// as a provider reports it.
func providerDeposit(n, user int64, amount string) postgres.NewEvent {
	tr := payment.Transfer{Network: "ETH_MAINNET", TxHash: fmt.Sprintf("0x%064x", n), Index: payment.TransferNative}
	return postgres.NewEvent{
		Event: payment.Event{ID: tr.EventID(), Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: dec(amount),
			TxHash: tr.TxHash, TransferIndex: tr.Index, Network: tr.Network, TraceID: "trace"},
		Source: postgres.SourceAlchemy,
	}
}

// storedTask inserts e and claims it as the enqueuer does.
func (f *fixture) storedTask(e postgres.NewEvent) payment.Event {
	f.t.Helper()
	inserted, err := f.db.InsertEvent(context.Background(), e)
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	return f.claim(e.Event.ID)
}

// TestSupersedeRacesTheLedger: while the ledger holds a deposit's row
// (its claim's lock) and decides mismatch, a supersede of the same
// transfer waits, then replaces the content; the old generation's task
// then moves nothing and the new one credits the chain's amount once.
// While the ledger credits the deposit instead, the supersede waits and
// is refused.
func TestSupersedeRacesTheLedger(t *testing.T) {
	ctx := context.Background()
	for _, decides := range []string{"mismatch", "credit"} {
		t.Run(decides, func(t *testing.T) {
			f := newFixture(t)
			f.user(1, nil)
			f.user(2, nil)
			wrong := providerDeposit(1, 2, "5")
			task := f.storedTask(wrong)
			truth := providerDeposit(1, 1, "1")
			truth.Source = postgres.SourceScanner

			// The ledger's transaction, on a connection of its own.
			ledger, err := f.sql.Begin(ctx)
			require.NoError(t, err)
			_, err = ledger.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = $1 FOR UPDATE`, wrong.Event.ID)
			require.NoError(t, err)
			if decides == "mismatch" {
				_, err = ledger.Exec(ctx, `UPDATE payment_events SET status = 'failed', outcome = 'mismatch', error = 'pays 1 ETH' WHERE event_id = $1`, wrong.Event.ID)
			} else {
				_, err = ledger.Exec(ctx, `UPDATE payment_events SET status = 'confirmed', outcome = 'success' WHERE event_id = $1`, wrong.Event.ID)
				require.NoError(t, err)
				// A credit holds its transfer's claim (0027 refuses it otherwise).
				_, err = ledger.Exec(ctx, `INSERT INTO chain_transfers (network, tx_hash, transfer_index, event_id, asset) VALUES ($1, $2, $3, $4, 'ETH')`,
					payment.DefaultNetwork, wrong.Event.TxHash, payment.TransferNative, wrong.Event.ID)
			}
			require.NoError(t, err)

			done := make(chan postgres.SupersedeResult, 1)
			errs := make(chan error, 1)
			go func() {
				r, err := f.db.SupersedeDeposit(ctx, truth, "scanner")
				errs <- err
				done <- r
			}()
			f.waitForLockWaiters(1)
			require.NoError(t, ledger.Commit(ctx))
			require.NoError(t, <-errs)
			result := <-done

			if decides == "credit" {
				require.Equal(t, postgres.SupersedeRefused, result, "a credited deposit is never overwritten")
				require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = $1 AND user_id = 2 AND amount = 5 AND generation = $2`,
					wrong.Event.ID, task.Generation))
				require.Zero(t, f.count(`SELECT count(*) FROM event_rechecks`))
				return
			}
			require.Equal(t, postgres.SupersedeDone, result)
			require.Equal(t, "reopened", f.keyOutcome(wrong.Event.ID))
			retry := f.claim(wrong.Event.ID)
			require.Equal(t, task.Generation+1, retry.Generation)
			require.Equal(t, int64(1), retry.UserID)
			require.True(t, dec("1").Equal(retry.Amount))
			f.applyChain([]string{payment.TransferNative}, task) // the wrong content's task moves nothing
			f.applyChain([]string{payment.TransferNative}, retry)
			f.applyChain([]string{payment.TransferNative}, retry)
			status, outcome := f.status(wrong.Event.ID)
			require.Equal(t, payment.StatusConfirmed, status)
			require.Equal(t, "success", outcome)
			require.True(t, f.balance(1, "ETH").Equal(dec("1")))
			require.True(t, f.balance(2, "ETH").IsZero())
			require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events`))
			require.Equal(t, 1, f.count(`SELECT count(*) FROM chain_transfers`))
			f.requireInvariants()

			// Credited now: a third report conflicts and changes nothing.
			again, err := f.db.SupersedeDeposit(ctx, providerDeposit(1, 1, "9"), "moralis")
			require.NoError(t, err)
			require.Equal(t, postgres.SupersedeRefused, again)
		})
	}
}

// TestTwoSupersedesOneWins: two different reports racing to supersede
// one failed/mismatch deposit: one replaces it, the other is refused
// (the deposit is pending by then); the same content twice is one
// supersede and a duplicate.
func TestTwoSupersedesOneWins(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.user(1, nil)
	f.user(2, nil)
	wrong := providerDeposit(2, 2, "5")
	task := f.storedTask(wrong)
	moved, err := f.db.DecideChainOutcome(ctx, task, payment.OutcomeMismatch, "the chain pays 1 ETH to user 1")
	require.NoError(t, err)
	require.True(t, moved)

	results := make(chan postgres.SupersedeResult, 2)
	for _, amount := range []string{"1", "2"} {
		go func() {
			r, err := f.db.SupersedeDeposit(ctx, providerDeposit(2, 1, amount), "scanner")
			if err != nil {
				r = postgres.SupersedeResult("error: " + err.Error())
			}
			results <- r
		}()
	}
	got := []postgres.SupersedeResult{<-results, <-results}
	require.ElementsMatch(t, []postgres.SupersedeResult{postgres.SupersedeDone, postgres.SupersedeRefused}, got)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM event_rechecks WHERE event_id = $1`, wrong.Event.ID))

	var amount string
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT amount::text FROM payment_events WHERE event_id = $1`, wrong.Event.ID).Scan(&amount))
	same, err := f.db.SupersedeDeposit(ctx, providerDeposit(2, 1, dec(amount).String()), "quicknode")
	require.NoError(t, err)
	require.Equal(t, postgres.SupersedeSame, same)
}

// TestSupersedeOnlyTransferIdentities: a /webhook/payments id, a
// compensation or an id that is not its own transfer's never supersedes,
// whatever the stored state.
func TestSupersedeOnlyTransferIdentities(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.user(1, nil)
	task := f.failedByChain("pay-1", payment.OutcomeMismatch)
	other := postgres.NewEvent{Event: payment.Event{ID: "pay-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1"),
		TxHash: task.TxHash, TransferIndex: payment.TransferNative, Network: "ETH_MAINNET"}}
	r, err := f.db.SupersedeDeposit(ctx, other, "payments")
	require.NoError(t, err)
	require.Equal(t, postgres.SupersedeRefused, r)

	// A chain: id that names another transfer than the event's.
	wrong := providerDeposit(3, 1, "5")
	wrongTask := f.storedTask(wrong)
	_, err = f.db.DecideChainOutcome(ctx, wrongTask, payment.OutcomeMismatch, "no")
	require.NoError(t, err)
	forged := providerDeposit(3, 1, "1")
	forged.Event.TransferIndex = "0"
	r, err = f.db.SupersedeDeposit(ctx, forged, "scanner")
	require.NoError(t, err)
	require.Equal(t, postgres.SupersedeRefused, r)
	status, _ := f.status(wrong.Event.ID)
	require.Equal(t, payment.StatusFailed, status)
}
