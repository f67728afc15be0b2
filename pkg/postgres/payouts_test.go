package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// postWithTx is a post of holdID naming the transaction that pays it.
func (f *fixture) postWithTx(id string, user int64, holdID, amount, tx string) payment.Event {
	f.t.Helper()
	return f.enqueueEvent(payment.Event{ID: id, Type: payment.WithdrawalPost, UserID: user, Asset: "ETH", Amount: dec(amount),
		HoldID: holdID, TxHash: tx, Network: "ETH_MAINNET"})
}

// payoutEvidence is what the chain check says of a payment: final in a
// block, paying the hold with these transfers.
func payoutEvidence(e payment.Event, block string, first int64, transfers ...string) postgres.LedgerItem {
	return postgres.LedgerItem{Event: e, Chain: &postgres.ChainEvidence{BlockNumber: 7, BlockHash: block, FirstLogIndex: first, Transfers: transfers}}
}

// TestOnePaymentSettlesOnePostRacing: six users' holds of one amount to
// one address, each posted with the same transaction, applied at once
// through two pools (two workers' connections), on separate balance rows
// so that only the transfer lock orders them: one post debits, the others
// end duplicate_transfer with their holds open, and one payout row holds
// the transfer.
func TestOnePaymentSettlesOnePostRacing(t *testing.T) {
	f := newFixture(t)
	const users = 6
	var posts []payment.Event
	for u := int64(1); u <= users; u++ {
		f.user(u, map[string]string{"ETH": "100"})
		hold := fmt.Sprintf("h%d", u)
		requireOutcome(t, f.apply(f.holdTask(hold, u, "30"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
		posts = append(posts, f.postWithTx(fmt.Sprintf("p%d", u), u, hold, "30", txA))
	}
	pools := []*postgres.DB{f.db, testenv.OpenDB(t, f.dsn)}
	block := "0x" + strings.Repeat("b", 64)
	results := make([]postgres.LedgerResult, users)
	errs := make([]error, users)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, e := range posts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := pools[i%2].ApplyBatch(context.Background(), []postgres.LedgerItem{payoutEvidence(e, block, 0, payment.TransferNative)}, postgres.LedgerOptions{Notify: true})
			if err == nil {
				results[i] = r[0]
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	var posted []string
	for i, e := range posts {
		require.NoError(t, errs[i], e.ID)
		require.Equal(t, postgres.Applied, results[i].Kind, "%s: %v", e.ID, results[i].Err)
		hold := fmt.Sprintf("h%d", e.UserID)
		status, by := f.holdStatus(hold)
		if results[i].Outcome == payment.OutcomeSuccess {
			posted = append(posted, e.ID)
			require.Equal(t, "posted", status)
			require.Equal(t, e.ID, by)
			require.Equal(t, "70", f.balance(e.UserID, "ETH").String())
			require.Equal(t, "0", f.held(e.UserID, "ETH"))
			require.Equal(t, []string{"withdrawal -30"}, f.journal(e.ID))
			continue
		}
		require.Equal(t, payment.StatusFailed, results[i].Status, e.ID)
		require.Equal(t, payment.OutcomeDuplicateTransfer, results[i].Outcome, e.ID)
		require.Equal(t, "open", status, "a post refused for its transfer leaves %s open", hold)
		require.Equal(t, "100", f.balance(e.UserID, "ETH").String())
		require.Equal(t, "30", f.held(e.UserID, "ETH"))
		require.Empty(t, f.journal(e.ID))
	}
	require.Len(t, posted, 1, "one payment settles one post")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payout_transfers WHERE tx_hash = $1 AND transfer = 'native' AND transfer_index = 'native' AND event_id = $2 AND block_hash = $3`,
		txA, posted[0], block))
	require.Equal(t, users-1, f.count(`SELECT count(*) FROM payment_events WHERE outcome = 'duplicate_transfer' AND status = 'failed'`))
	f.requireInvariants()
}

// TestPayoutClaimsAcrossBatches: a payment of two matching transfers
// settles two posts, in separate transactions, one transfer each; a third
// post of it finds both taken, also after the transaction is mined in
// another block (its logs there have other indexes); a post replayed
// after it committed finds its own claim; a deposit of the same transfer
// is not a payout and still credits; a post the chain did not check
// claims nothing.
func TestPayoutClaimsAcrossBatches(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "100"})
	f.user(2, nil)
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} {
		requireOutcome(t, f.apply(f.holdTask(h, 1, "10"))[0], payment.StatusConfirmed, payment.OutcomeHeld)
	}
	blockA, blockB := "0x"+strings.Repeat("a", 64), "0x"+strings.Repeat("b", 64)
	apply := func(item postgres.LedgerItem) postgres.LedgerResult {
		t.Helper()
		r, err := f.db.ApplyBatch(context.Background(), []postgres.LedgerItem{item}, postgres.LedgerOptions{})
		require.NoError(t, err)
		return r[0]
	}
	// The transaction's logs are 3, 4, 5 in block A; 4 and 5 pay a hold.
	p1 := f.postWithTx("p1", 1, "h1", "10", txB)
	requireOutcome(t, apply(payoutEvidence(p1, blockA, 3, "4", "5")), payment.StatusConfirmed, payment.OutcomeSuccess)
	p2 := f.postWithTx("p2", 1, "h2", "10", txB)
	requireOutcome(t, apply(payoutEvidence(p2, blockA, 3, "4", "5")), payment.StatusConfirmed, payment.OutcomeSuccess)
	// Mined again in block B, the same logs are 11, 12, 13.
	p3 := f.postWithTx("p3", 1, "h3", "10", txB)
	requireOutcome(t, apply(payoutEvidence(p3, blockB, 11, "12", "13")), payment.StatusFailed, payment.OutcomeDuplicateTransfer)
	status, _ := f.holdStatus("h3")
	require.Equal(t, "open", status)

	rows, err := f.sql.Query(context.Background(), `SELECT event_id || '@' || transfer || '=' || transfer_index FROM payout_transfers ORDER BY event_id`)
	require.NoError(t, err)
	var claims []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		claims = append(claims, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"p1@log:1=4", "p2@log:2=5"}, claims)

	// The console shows a post's transfer as it shows a deposit's.
	story, err := f.db.EventStory(context.Background(), "p2")
	require.NoError(t, err)
	require.NotNil(t, story.Claim)
	require.Equal(t, "5", story.Claim.TransferIndex)
	require.Equal(t, blockA, story.Claim.BlockHash)
	require.NotNil(t, story.Claim.LogPosition)
	require.EqualValues(t, 2, *story.Claim.LogPosition)

	// The same task again: done, nothing claimed twice.
	require.Equal(t, postgres.AlreadyDone, apply(payoutEvidence(p1, blockA, 3, "4", "5")).Kind)

	// One transfer can be a payout and a deposit (the hot wallet paying a
	// user's deposit address): the claims are apart.
	dep := f.transferDeposit("dep", 2, "ETH", "3", txA, "")
	requireOutcome(t, f.applyChain([]string{payment.TransferNative}, dep)[0], payment.StatusConfirmed, payment.OutcomeSuccess)
	p4 := f.postWithTx("p4", 1, "h4", "10", txA)
	requireOutcome(t, apply(payoutEvidence(p4, blockA, 0, payment.TransferNative)), payment.StatusConfirmed, payment.OutcomeSuccess)

	// Without an RPC the post is trusted, and names no transfer to claim.
	p5 := f.postWithTx("p5", 1, "h5", "10", txA)
	requireOutcome(t, apply(postgres.LedgerItem{Event: p5}), payment.StatusConfirmed, payment.OutcomeSuccess)
	require.Equal(t, 3, f.count(`SELECT count(*) FROM payout_transfers`))
	require.Equal(t, "60", f.balance(1, "ETH").String())
	require.Equal(t, "10", f.held(1, "ETH"))
	f.requireInvariants()

	// The invariant sees a claim by a post that was refused.
	_, err = f.sql.Exec(context.Background(), `INSERT INTO payout_transfers (network, tx_hash, transfer, transfer_index, block_hash, asset, event_id)
		VALUES ('ETH_MAINNET', $1, 'log:0', '11', $2, 'ETH', 'p3')`, txB, blockB)
	require.NoError(t, err)
	report, err := invariant.Check(context.Background(), f.db, invariant.Quiet())
	require.NoError(t, err)
	require.False(t, report.OK())
	require.Contains(t, report.String(), "FAIL every payout_transfers row names one confirmed post: 1 violation(s), e.g. ETH_MAINNET:"+txB+":log:0=p3")
}
