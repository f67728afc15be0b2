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

const (
	txA = "0x" + "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
	txB = "0x" + "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
)

// transferDeposit accepts a deposit naming a transaction (and, if index is
// set, a transfer in it) and claims it as the enqueuer does.
func (f *fixture) transferDeposit(id string, user int64, asset, amount, tx, index string) payment.Event {
	f.t.Helper()
	e := payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: asset, Amount: dec(amount), TxHash: tx, TransferIndex: index, TraceID: "trace-" + id}
	inserted, err := f.db.InsertEvent(context.Background(), postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	return f.claim(id)
}

// applyChain applies events with the chain check's candidate transfers.
func (f *fixture) applyChain(transfers []string, events ...payment.Event) []postgres.LedgerResult {
	f.t.Helper()
	items := make([]postgres.LedgerItem, len(events))
	for i, e := range events {
		items[i] = postgres.LedgerItem{Event: e, Chain: &postgres.ChainEvidence{BlockNumber: 7, BlockHash: "0x" + strings.Repeat("c", 64), Transfers: transfers}}
	}
	results, err := f.db.ApplyBatch(context.Background(), items, postgres.LedgerOptions{})
	require.NoError(f.t, err)
	return results
}

func (f *fixture) claimOf(id string) string {
	f.t.Helper()
	var index string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT COALESCE((SELECT transfer_index FROM chain_transfers WHERE event_id = $1), '')`, id).Scan(&index))
	return index
}

// requireInvariants runs the invariant package's checks, 5 included.
func (f *fixture) requireInvariants() {
	f.t.Helper()
	report, err := invariant.Check(context.Background(), f.db, invariant.Quiet())
	require.NoError(f.t, err)
	require.True(f.t, report.OK(), report.String())
}

func TestTransferCreditsOnceWhateverTheIDs(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	first := f.transferDeposit("payments-1", 1, "ETH", "2", txA, "")
	second := f.transferDeposit("payments-2", 1, "ETH", "2", txA, "")
	// The chain check finds the same transfer for both; in one batch or
	// in two, one of them is credited.
	results := f.applyChain([]string{payment.TransferNative}, first)
	require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	results = f.applyChain([]string{payment.TransferNative}, second)
	require.Equal(t, payment.StatusFailed, results[0].Status)
	require.Equal(t, payment.OutcomeDuplicateTransfer, results[0].Outcome)

	status, outcome := f.status("payments-2")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, string(payment.OutcomeDuplicateTransfer), outcome)
	require.True(t, dec("2").Equal(f.balance(1, "ETH")))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE user_id = 1`))
	require.Zero(t, f.count(`SELECT count(*) FROM dead_letter_queue`), "a duplicate transfer is a business outcome, not a dead letter")
	require.Equal(t, payment.TransferNative, f.claimOf("payments-1"))
	require.Equal(t, "", f.claimOf("payments-2"))
	f.requireInvariants()

	// Redelivered, the refused task stays refused and moves nothing.
	results = f.applyChain([]string{payment.TransferNative}, second)
	require.Equal(t, postgres.AlreadyDone, results[0].Kind)
	require.True(t, dec("2").Equal(f.balance(1, "ETH")))
}

func TestTransferClaimsInOneBatch(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	a := f.transferDeposit("same-batch-a", 1, "ETH", "1", txA, "")
	b := f.transferDeposit("same-batch-b", 1, "ETH", "1", txA, "")
	results := f.applyChain([]string{payment.TransferNative}, a, b)
	outcomes := []payment.Outcome{results[0].Outcome, results[1].Outcome}
	require.ElementsMatch(t, []payment.Outcome{payment.OutcomeSuccess, payment.OutcomeDuplicateTransfer}, outcomes)
	require.True(t, dec("1").Equal(f.balance(1, "ETH")))
	f.requireInvariants()
}

// TestTwoIdenticalLogs: a transaction with two identical Transfer logs to
// one address pays twice; two deposits may claim one log each, a third is
// a duplicate.
func TestTwoIdenticalLogs(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	logs := []string{"3", "5"}
	var outcomes []payment.Outcome
	for i := range 3 {
		e := f.transferDeposit(fmt.Sprintf("log-%d", i), 1, "USDC", "10", txA, "")
		outcomes = append(outcomes, f.applyChain(logs, e)[0].Outcome)
	}
	require.Equal(t, []payment.Outcome{payment.OutcomeSuccess, payment.OutcomeSuccess, payment.OutcomeDuplicateTransfer}, outcomes)
	require.Equal(t, "3", f.claimOf("log-0"))
	require.Equal(t, "5", f.claimOf("log-1"))
	require.True(t, dec("20").Equal(f.balance(1, "USDC")))
	f.requireInvariants()
}

// TestNamedTransfer: a deposit that names its transfer claims that one;
// another deposit may take the other transfer of the same transaction.
func TestNamedTransfer(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	named := f.transferDeposit("named-5", 1, "USDC", "10", txA, "5")
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"5"}, named)[0].Outcome)
	any := f.transferDeposit("any", 1, "USDC", "10", txA, "")
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"3", "5"}, any)[0].Outcome)
	require.Equal(t, "3", f.claimOf("any"))
	again := f.transferDeposit("named-5-again", 1, "USDC", "10", txA, "5")
	require.Equal(t, payment.OutcomeDuplicateTransfer, f.applyChain([]string{"5"}, again)[0].Outcome)
	f.requireInvariants()
}

// TestClaimsWithoutChainCheck: with no RPC the ledger takes a deposit at
// its word: the named transfer, the native value, or, for a token deposit
// that names none, an unresolved claim on its transaction that no later
// claim of that asset may pass.
func TestClaimsWithoutChainCheck(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	native := f.transferDeposit("nochain-eth-1", 1, "ETH", "1", txA, "")
	nativeAgain := f.transferDeposit("nochain-eth-2", 1, "ETH", "1", txA, "")
	token := f.transferDeposit("nochain-usdc-1", 1, "USDC", "5", txA, "")
	tokenLog := f.transferDeposit("nochain-usdc-log", 1, "USDC", "5", txA, "9")
	otherTx := f.transferDeposit("nochain-usdc-other", 1, "USDC", "5", txB, "9")
	results := f.apply(native, nativeAgain, token, tokenLog, otherTx)
	require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	require.Equal(t, payment.OutcomeDuplicateTransfer, results[1].Outcome)
	require.Equal(t, payment.OutcomeSuccess, results[2].Outcome)
	require.Equal(t, payment.OutcomeDuplicateTransfer, results[3].Outcome, "an unresolved claim holds the transaction's USDC transfer")
	require.Equal(t, payment.OutcomeSuccess, results[4].Outcome)
	require.Equal(t, payment.UnresolvedTransfer("nochain-usdc-1"), f.claimOf("nochain-usdc-1"))
	require.True(t, dec("1").Equal(f.balance(1, "ETH")))
	require.True(t, dec("10").Equal(f.balance(1, "USDC")))

	// The chain check, once there is one, counts the unresolved claim too.
	checked := f.transferDeposit("checked-usdc", 1, "USDC", "5", txA, "")
	require.Equal(t, payment.OutcomeSuccess, f.applyChain([]string{"4", "9"}, checked)[0].Outcome)
	require.Equal(t, "9", f.claimOf("checked-usdc"), "log 4 is presumed the unresolved claim's")
	f.requireInvariants()
}

// TestTransferClaimRace: ten events naming one transfer, applied at once
// through two pools (two workers' connections): one credit.
func TestTransferClaimRace(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	f.user(2, nil)
	pools := []*postgres.DB{f.db, testenv.OpenDB(t, f.dsn)}
	var events []payment.Event
	for i := range 10 {
		// Two users, so the batches do not simply queue on one balance row.
		events = append(events, f.transferDeposit(fmt.Sprintf("race-%d", i), int64(1+i%2), "ETH", "3", txA, ""))
	}
	var wg sync.WaitGroup
	outcomes := make([]payment.Outcome, len(events))
	errs := make([]error, len(events))
	for i, e := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			item := postgres.LedgerItem{Event: e, Chain: &postgres.ChainEvidence{BlockNumber: 1, BlockHash: "0x" + strings.Repeat("d", 64), Transfers: []string{payment.TransferNative}}}
			results, err := pools[i%2].ApplyBatch(context.Background(), []postgres.LedgerItem{item}, postgres.LedgerOptions{})
			if err == nil {
				outcomes[i] = results[0].Outcome
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	credited := 0
	for i := range events {
		require.NoError(t, errs[i])
		if outcomes[i] == payment.OutcomeSuccess {
			credited++
		} else {
			require.Equal(t, payment.OutcomeDuplicateTransfer, outcomes[i])
		}
	}
	require.Equal(t, 1, credited)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM chain_transfers`))
	total := f.balance(1, "ETH").Add(f.balance(2, "ETH"))
	require.True(t, dec("3").Equal(total), total.String())
	f.requireInvariants()
}

// TestClaimFollowsTheTransferToAnotherBlock: a log index counts within its
// block, so a transaction mined again in another block after a reorg
// shows the same transfer under another index. The claim made in the old
// block still holds it there (and moves to the new index).
func TestClaimFollowsTheTransferToAnotherBlock(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	apply := func(e payment.Event, block string, first int64, transfers ...string) payment.Outcome {
		item := postgres.LedgerItem{Event: e, Chain: &postgres.ChainEvidence{BlockNumber: 9, BlockHash: block, FirstLogIndex: first, Transfers: transfers}}
		results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{item}, postgres.LedgerOptions{})
		require.NoError(t, err)
		return results[0].Outcome
	}
	blockA, blockB := "0x"+strings.Repeat("a", 64), "0x"+strings.Repeat("b", 64)
	// In block A the transaction's logs are 3, 4, 5; the deposit is log 5.
	first := f.transferDeposit("moved-first", 1, "USDC", "10", txA, "")
	require.Equal(t, payment.OutcomeSuccess, apply(first, blockA, 3, "5"))
	// Mined again in block B, its logs are 10, 11, 12: the same transfer
	// is log 12, and a report of it under that index is a duplicate.
	again := f.transferDeposit("moved-again", 1, "USDC", "10", txA, "")
	require.Equal(t, payment.OutcomeDuplicateTransfer, apply(again, blockB, 10, "12"))
	var index, block string
	require.NoError(t, f.sql.QueryRow(ctx, `SELECT transfer_index, block_hash FROM chain_transfers WHERE event_id = 'moved-first'`).Scan(&index, &block))
	require.Equal(t, "12", index, "the claim moved with its transfer")
	require.Equal(t, blockB, block)
	// Another transfer of that transaction in block B is still free.
	other := f.transferDeposit("moved-other", 1, "USDC", "10", txA, "")
	require.Equal(t, payment.OutcomeSuccess, apply(other, blockB, 10, "11", "12"))
	require.Equal(t, "11", f.claimOf("moved-other"))
	require.True(t, dec("20").Equal(f.balance(1, "USDC")))
	f.requireInvariants()
}

// TestCompensatedClaimFoundFromAnotherBlock: a token deposit credited
// in block A, compensated when a reorg dropped its transaction, which is
// then mined again in block B, where its Transfer has another log index:
// the report of that index (a new chain: id, by a provider or the
// scanner) watches the compensated deposit again, as a report of its own
// index would, so the watcher can give it back. Where the report is the
// evidence (no watch), only the exact claim counts. A deposit on another
// transaction is not touched.
func TestCompensatedClaimFoundFromAnotherBlock(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	blockA := "0x" + strings.Repeat("a", 64)
	credit := func(id, tx string) {
		e := f.transferDeposit(id, 1, "USDC", "10", tx, "5")
		item := postgres.LedgerItem{Event: e, Chain: &postgres.ChainEvidence{BlockNumber: 9, BlockHash: blockA, FirstLogIndex: 3, Watch: true, Transfers: []string{"5"}}}
		results, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{item}, postgres.LedgerOptions{})
		require.NoError(t, err)
		require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	}
	credit("dropped", txA)
	credit("elsewhere", txB)
	for _, id := range []string{"dropped", "elsewhere"} {
		r, err := f.db.ReverseDeposit(ctx, id, "gone", "")
		require.NoError(t, err)
		require.Equal(t, postgres.Compensating, r)
	}
	testenv.SettleOutbox(t, f.db)
	require.True(t, dec("0").Equal(f.balance(1, "USDC")))

	moved := payment.Transfer{Network: "ETH_MAINNET", TxHash: txA, Index: "12"}
	r, err := f.db.ReturnDeposit(ctx, "", moved, false, "reported in block B")
	require.NoError(t, err)
	require.Equal(t, postgres.NotCompensated, r, "the report's word alone: only the exact claim")
	r, err = f.db.ReturnDeposit(ctx, "", moved, true, "reported in block B")
	require.NoError(t, err)
	require.Equal(t, postgres.WatchedAgain, r)
	state := func(id string) string {
		var s string
		require.NoError(t, f.sql.QueryRow(ctx, `SELECT chain_state FROM payment_events WHERE event_id = $1`, id).Scan(&s))
		return s
	}
	require.Equal(t, "watching", state("dropped"))
	require.Equal(t, "reorged", state("elsewhere"), "another transaction's deposit")
	r, err = f.db.ReturnDeposit(ctx, "", moved, true, "reported again")
	require.NoError(t, err)
	require.Equal(t, postgres.NotCompensated, r, "watched already")
	f.requireInvariants()
}
