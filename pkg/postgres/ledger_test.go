package postgres_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/testenv"
)

// fixture is a fresh database with a raw connection for checks.
type fixture struct {
	t   *testing.T
	dsn string
	db  *postgres.DB
	sql *pgx.Conn
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dsn := testenv.DatabaseURL(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &fixture{t: t, dsn: dsn, db: testenv.OpenDB(t, dsn), sql: conn}
}

// with is f reporting to a subtest's t.
func (f *fixture) with(t *testing.T) *fixture {
	c := *f
	c.t = t
	return &c
}

func dec(s string) decimal.Decimal { return decimal.RequireFromString(s) }

func (f *fixture) user(id int64, initial map[string]string) {
	f.t.Helper()
	ctx := context.Background()
	_, err := f.db.CreateUser(ctx, id)
	require.NoError(f.t, err)
	for asset, amount := range initial {
		require.NoError(f.t, f.db.SetInitialBalance(ctx, id, asset, dec(amount)))
	}
}

// enqueue accepts an event and claims it the way the enqueuer does,
// returning the task the queue would carry.
func (f *fixture) enqueue(id string, typ payment.EventType, user int64, asset, amount string) payment.Event {
	f.t.Helper()
	ctx := context.Background()
	e := payment.Event{ID: id, Type: typ, UserID: user, Asset: asset, Amount: dec(amount), TraceID: "trace-" + id}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
	require.NoError(f.t, err)
	require.True(f.t, inserted)
	claimed, err := f.db.ClaimOutbox(ctx, 1000, 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	for _, c := range claimed {
		if c.Event.ID == id {
			return c.Event
		}
	}
	f.t.Fatalf("event %s was not claimed", id)
	return payment.Event{}
}

// reEnqueued is an event of user 1 handed to the queue afresh (generation
// 1), as stale recovery or a DLQ replay does: only such an event may meet
// an idempotency record written before, so only its records are read.
func (f *fixture) reEnqueued(id string, typ payment.EventType, amount string) payment.Event {
	f.t.Helper()
	task := f.enqueue(id, typ, 1, "ETH", amount)
	_, err := f.sql.Exec(context.Background(), `UPDATE payment_events SET generation = 1 WHERE event_id = $1`, id)
	require.NoError(f.t, err)
	task.Generation = 1
	return task
}

func (f *fixture) apply(events ...payment.Event) []postgres.LedgerResult {
	f.t.Helper()
	items := make([]postgres.LedgerItem, len(events))
	for i, e := range events {
		items[i] = postgres.LedgerItem{Event: e}
	}
	results, err := f.db.ApplyBatch(context.Background(), items, postgres.LedgerOptions{Notify: true})
	require.NoError(f.t, err)
	return results
}

func (f *fixture) balance(user int64, asset string) decimal.Decimal {
	f.t.Helper()
	var text string
	err := f.sql.QueryRow(context.Background(), `SELECT COALESCE((SELECT balance::text FROM balances WHERE user_id=$1 AND asset=$2), '0')`, user, asset).Scan(&text)
	require.NoError(f.t, err)
	return dec(text)
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.sql.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

func (f *fixture) status(id string) (payment.Status, string) {
	f.t.Helper()
	var status string
	var outcome *string
	require.NoError(f.t, f.sql.QueryRow(context.Background(), `SELECT status, outcome FROM payment_events WHERE event_id=$1`, id).Scan(&status, &outcome))
	if outcome == nil {
		return payment.Status(status), ""
	}
	return payment.Status(status), *outcome
}

// requireJournalInvariant checks CONTRACT.md invariant 1 for every balance.
func (f *fixture) requireJournalInvariant() {
	f.t.Helper()
	n := f.count(`SELECT count(*) FROM balances b
		WHERE b.balance <> b.initial_balance + COALESCE((SELECT SUM(amount) FROM balance_events e WHERE e.user_id=b.user_id AND e.asset=b.asset), 0)`)
	require.Zero(f.t, n, "balances that differ from initial + journal")
	require.Zero(f.t, f.count(`SELECT count(*) FROM balances WHERE balance < 0`))
}

func TestDepositIsCreditedOnce(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	task := f.enqueue("dep-1", payment.Deposit, 1, "ETH", "1.5")

	results := f.apply(task)
	require.Equal(t, postgres.Applied, results[0].Kind)
	require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	require.True(t, f.balance(1, "ETH").Equal(dec("1.5")))

	// The same task again (a redelivery), and twice in one batch.
	again := f.apply(task, task)
	require.Equal(t, postgres.AlreadyDone, again[0].Kind)
	require.Equal(t, postgres.AlreadyDone, again[1].Kind)
	require.True(t, f.balance(1, "ETH").Equal(dec("1.5")))

	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id='dep-1'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id='dep-1' AND outcome='success'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM notification_outbox WHERE delivery_id='deposit_credited:dep-1'`))
	status, outcome := f.status("dep-1")
	require.Equal(t, payment.StatusConfirmed, status)
	require.Equal(t, "success", outcome)
	f.requireJournalInvariant()
}

func TestBatchAppliesManyUsersAndAssetsInOrder(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"USDC": "10"})
	f.user(2, nil)
	var tasks []payment.Event
	tasks = append(tasks, f.enqueue("a", payment.Deposit, 2, "ETH", "3.000000000000000001"))
	tasks = append(tasks, f.enqueue("b", payment.Withdrawal, 1, "USDC", "4"))
	tasks = append(tasks, f.enqueue("c", payment.Withdrawal, 1, "USDC", "4"))
	tasks = append(tasks, f.enqueue("d", payment.WithdrawalFee, 1, "USDC", "4")) // only 2 left: refused
	tasks = append(tasks, f.enqueue("e", payment.Airdrop, 1, "USDC", "0.5"))
	results := f.apply(tasks...)
	for i, r := range results {
		require.Equal(t, postgres.Applied, r.Kind, tasks[i].ID)
	}
	require.Equal(t, payment.OutcomeInsufficientFunds, results[3].Outcome, "the third debit of 4 from 10 (first come, first served)")
	require.True(t, f.balance(2, "ETH").Equal(dec("3.000000000000000001")))
	require.True(t, f.balance(1, "USDC").Equal(dec("2.5")))
	status, outcome := f.status("d")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, "insufficient_funds", outcome)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM notification_outbox WHERE kind='insufficient_funds'`))
	f.requireJournalInvariant()
}

func TestConcurrentWithdrawalsNeverOverdraw(t *testing.T) {
	f := newFixture(t)
	f.user(7, map[string]string{"ETH": "100"})
	const n = 50
	tasks := make([]payment.Event, n)
	for i := range tasks {
		tasks[i] = f.enqueue(fmt.Sprintf("w-%d", i), payment.Withdrawal, 7, "ETH", "10")
	}
	// 50 goroutines, each its own transaction on its own pooled connection.
	results := make([]postgres.LedgerResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range tasks {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			for attempt := 0; attempt < 50; attempt++ { // lock timeouts are retried, as the worker does
				r, err := f.db.ApplyBatch(context.Background(), []postgres.LedgerItem{{Event: tasks[i]}}, postgres.LedgerOptions{})
				if err == nil {
					results[i] = r[0]
					errs[i] = nil
					return
				}
				errs[i] = err
				require.ErrorIs(t, err, payment.ErrRetryable)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	succeeded, refused := 0, 0
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, postgres.Applied, r.Kind)
		switch r.Outcome {
		case payment.OutcomeSuccess:
			succeeded++
		case payment.OutcomeInsufficientFunds:
			refused++
		default:
			t.Fatalf("unexpected outcome %s", r.Outcome)
		}
	}
	require.Equal(t, 10, succeeded)
	require.Equal(t, 40, refused)
	require.True(t, f.balance(7, "ETH").IsZero())
	require.Equal(t, 10, f.count(`SELECT count(*) FROM balance_events WHERE user_id=7`))
	require.Equal(t, 40, f.count(`SELECT count(*) FROM payment_events WHERE outcome='insufficient_funds'`))
	f.requireJournalInvariant()
}

// TestTenProcessesDeliverOneDeposit races ten OS processes, each with its
// own connection pool, on the same enqueued deposit.
func TestTenProcessesDeliverOneDeposit(t *testing.T) {
	f := newFixture(t)
	f.user(3, nil)
	task := f.enqueue("race-1", payment.Deposit, 3, "DAI", "50.1")

	const processes = 10
	startAt := time.Now().Add(2 * time.Second)
	cmds := make([]*exec.Cmd, processes)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerHelperProcess$", "-test.v")
		cmd.Env = testenv.Env(map[string]string{
			"SETTLE_HELPER_PROCESS": "apply",
			"SETTLE_HELPER_DSN":     f.dsn,
			"SETTLE_HELPER_EVENT":   task.ID,
			"SETTLE_HELPER_START":   strconv.FormatInt(startAt.UnixNano(), 10),
		})
		require.NoError(t, cmd.Start())
		cmds[i] = cmd
	}
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	require.True(t, f.balance(3, "DAI").Equal(dec("50.1")))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id='race-1'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM processed_events WHERE event_id='race-1'`))
	status, _ := f.status("race-1")
	require.Equal(t, payment.StatusConfirmed, status)
	f.requireJournalInvariant()
}

// TestLedgerHelperProcess is the child of TestTenProcessesDeliverOneDeposit.
func TestLedgerHelperProcess(t *testing.T) {
	if os.Getenv("SETTLE_HELPER_PROCESS") != "apply" {
		t.Skip("only runs as a child process")
	}
	ctx := context.Background()
	db, err := postgres.Open(ctx, os.Getenv("SETTLE_HELPER_DSN"), postgres.Options{ConnsMax: 2})
	require.NoError(t, err)
	defer db.Close()
	startNanos, _ := strconv.ParseInt(os.Getenv("SETTLE_HELPER_START"), 10, 64)
	time.Sleep(time.Until(time.Unix(0, startNanos)))
	task := payment.Event{ID: os.Getenv("SETTLE_HELPER_EVENT"), Type: payment.Deposit, UserID: 3, Asset: "DAI", Amount: dec("50.1")}
	for attempt := 0; attempt < 20; attempt++ {
		results, err := db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{})
		if err == nil {
			require.Contains(t, []postgres.LedgerResultKind{postgres.Applied, postgres.AlreadyDone}, results[0].Kind)
			return
		}
		require.ErrorIs(t, err, payment.ErrRetryable)
	}
	t.Fatal("never settled")
}

func TestReplayPathOutcomes(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	cases := []struct {
		outcome    string
		typ        payment.EventType
		wantStatus payment.Status
	}{
		{"success", payment.Deposit, payment.StatusConfirmed},
		{"insufficient_funds", payment.Withdrawal, payment.StatusFailed},
		{"reorged", payment.Deposit, payment.StatusFailed},
		{"reverted", payment.Deposit, payment.StatusFailed},
		{"not_found", payment.Deposit, payment.StatusFailed},
		{"mismatch", payment.Deposit, payment.StatusFailed},
	}
	for _, tc := range cases {
		t.Run(tc.outcome, func(t *testing.T) {
			f := f.with(t)
			id := "replay-" + tc.outcome
			task := f.reEnqueued(id, tc.typ, "1")
			// The key says the event was decided before, but the event
			// lags behind: the replay path must catch it up, moving no money.
			_, err := f.sql.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id, outcome) VALUES ($1, $2, $3)`,
				payment.IdempotencyKey(id, tc.typ), id, tc.outcome)
			require.NoError(t, err)
			before := f.balance(1, "ETH")
			results := f.apply(task)
			require.Equal(t, postgres.Applied, results[0].Kind)
			status, outcome := f.status(id)
			require.Equal(t, tc.wantStatus, status)
			require.Equal(t, tc.outcome, outcome)
			require.True(t, f.balance(1, "ETH").Equal(before), "a replay moves no money")
			require.Zero(t, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id=$1`, id))
		})
	}
	t.Run("pending key is retryable", func(t *testing.T) {
		f := f.with(t)
		task := f.reEnqueued("replay-pending", payment.Deposit, "1")
		_, err := f.sql.Exec(ctx, `INSERT INTO processed_events (idempotency_key, event_id) VALUES ($1, $2)`, task.Key(), task.ID)
		require.NoError(t, err)
		other := f.enqueue("replay-other", payment.Deposit, 1, "ETH", "2")
		results := f.apply(task, other)
		require.Equal(t, postgres.Retry, results[0].Kind)
		require.ErrorIs(t, results[0].Err, payment.ErrRetryable)
		require.Equal(t, postgres.Applied, results[1].Kind, "the rest of the batch goes through")
		status, _ := f.status(task.ID)
		require.Equal(t, payment.StatusEnqueued, status, "never left processing")
	})
}

func TestLockHeldElsewhereFailsFastAsRetryable(t *testing.T) {
	f := newFixture(t)
	f.user(5, map[string]string{"ETH": "10"})
	task := f.enqueue("locked-1", payment.Withdrawal, 5, "ETH", "1")
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM balances WHERE user_id=5 AND asset='ETH' FOR UPDATE`)
	require.NoError(t, err)

	opts := postgres.LedgerOptions{LockTimeout: 200 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		_, err := f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, opts)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, payment.ErrRetryable)
	case <-time.After(postgres.LedgerStatementTimeoutDefault + 5*time.Second):
		t.Fatal("the ledger hung on a held lock beyond its timeouts")
	}
	status, _ := f.status(task.ID)
	require.Equal(t, payment.StatusEnqueued, status)
	require.True(t, f.balance(5, "ETH").Equal(dec("10")))
}

func TestIntakeRejectsUnknownUserAssetAndPrecision(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	registry, err := f.db.Assets(ctx)
	require.NoError(t, err)

	_, err = f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "u", Type: payment.Deposit, UserID: 999, Asset: "ETH", Amount: dec("1")}})
	require.ErrorIs(t, err, payment.ErrUnknownUser)
	require.ErrorIs(t, err, payment.ErrInvalid)

	_, _, err = registry.ParseAmount("ETH_MAINNET", "DOGE", "1")
	require.ErrorIs(t, err, payment.ErrUnknownAsset)
	_, err = f.db.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "a", Type: payment.Deposit, UserID: 1, Asset: "DOGE", Amount: dec("1")}})
	require.ErrorIs(t, err, payment.ErrUnknownAsset)

	_, _, err = registry.ParseAmount("ETH_MAINNET", "USDC", "1.0000001")
	require.ErrorIs(t, err, payment.ErrBadAmount)
	_, amount, err := registry.ParseAmount("ETH_MAINNET", "USDC", "1.000000")
	require.NoError(t, err)
	require.True(t, amount.Equal(dec("1")))

	require.Zero(t, f.count(`SELECT count(*) FROM payment_events`), "nothing stored")
}

func TestConflictingRedeliveryIsRefused(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	e := payment.Event{ID: "c-1", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("50")}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e})
	require.NoError(t, err)
	require.True(t, inserted)
	same := e
	same.Amount = dec("50.000")
	inserted, err = f.db.InsertEvent(ctx, postgres.NewEvent{Event: same})
	require.NoError(t, err)
	require.False(t, inserted)
	other := e
	other.Amount = dec("51")
	_, err = f.db.InsertEvent(ctx, postgres.NewEvent{Event: other})
	require.ErrorIs(t, err, payment.ErrConflict)
}

func TestStaleAndForgedTasksDoNothing(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("gen-1", payment.Deposit, 1, "ETH", "1")

	stale := task
	stale.Generation = task.Generation + 1
	results := f.apply(stale)
	require.Equal(t, postgres.Stale, results[0].Kind)

	forged := task
	forged.Amount = dec("1000")
	results = f.apply(forged)
	require.Equal(t, postgres.Rejected, results[0].Kind)
	require.ErrorIs(t, results[0].Err, payment.ErrInvalid)

	missing := task
	missing.ID = "never-accepted"
	results = f.apply(missing)
	require.Equal(t, postgres.Rejected, results[0].Kind)
	require.ErrorIs(t, results[0].Err, payment.ErrNotFound)

	require.True(t, f.balance(1, "ETH").IsZero())
	results = f.apply(task)
	require.Equal(t, postgres.Applied, results[0].Kind)
	require.True(t, f.balance(1, "ETH").Equal(dec("1")))
	_ = ctx
}

func TestCompensationThatCannotBeCoveredGoesToTheDLQ(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	dep := f.enqueue("dep-r", payment.Deposit, 1, "ETH", "5")
	f.apply(dep)
	w := f.enqueue("spend", payment.Withdrawal, 1, "ETH", "4")
	f.apply(w)

	reversal, err := f.db.ReverseDeposit(ctx, "dep-r", "receipt gone", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Compensating, reversal)
	again, err := f.db.ReverseDeposit(ctx, "dep-r", "reported twice", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Compensating, again)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id='reorg:dep-r'`))

	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	results := f.apply(claimed[0].Event)
	require.Equal(t, payment.OutcomeDeadLettered, results[0].Outcome)
	require.NotZero(t, results[0].DeadLetterID)
	require.NotEmpty(t, results[0].Alert)
	require.True(t, f.balance(1, "ETH").Equal(dec("1")), "nothing goes negative")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id='reorg:dep-r' AND source='ledger'`))
	status, outcome := f.status("reorg:dep-r")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, "dead_lettered", outcome)
	f.requireJournalInvariant()
}

func TestCompensationDebitsACreditedDeposit(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	f.apply(f.enqueue("dep-c", payment.Deposit, 1, "USDC", "5"))
	_, err := f.db.ReverseDeposit(ctx, "dep-c", "block hash changed", "")
	require.NoError(t, err)
	claimed, err := f.db.ClaimOutbox(ctx, 10, 0, postgres.TaskEventsMax)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, payment.ReorgCompensation, claimed[0].Event.Type)
	results := f.apply(claimed[0].Event)
	require.Equal(t, payment.OutcomeSuccess, results[0].Outcome)
	require.True(t, f.balance(1, "USDC").IsZero())
	require.Equal(t, 1, f.count(`SELECT count(*) FROM balance_events WHERE source_event_id='reorg:dep-c' AND event_type='reorg_compensation' AND amount = -5`))
	status, _ := f.status("dep-c")
	require.Equal(t, payment.StatusConfirmed, status, "the original stays confirmed")
	f.requireJournalInvariant()
}

func TestUncreditedDepositIsVoidedByAReorg(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("dep-v", payment.Deposit, 1, "ETH", "5")
	reversal, err := f.db.ReverseDeposit(ctx, "dep-v", "removed", "")
	require.NoError(t, err)
	require.Equal(t, postgres.Voided, reversal)
	status, outcome := f.status("dep-v")
	require.Equal(t, payment.StatusFailed, status)
	require.Equal(t, "reorged", outcome)
	results := f.apply(task)
	require.Equal(t, postgres.AlreadyDone, results[0].Kind, "the in-flight task finds it decided")
	require.True(t, f.balance(1, "ETH").IsZero())
	again, err := f.db.ReverseDeposit(ctx, "dep-v", "removed again", "")
	require.NoError(t, err)
	require.Equal(t, postgres.AlreadyFailed, again)
}

func TestCreditPastTheColumnLimitIsDeadLettered(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "99999999999999999999"})
	results := f.apply(f.enqueue("huge", payment.Deposit, 1, "ETH", "1"))
	require.Equal(t, payment.OutcomeDeadLettered, results[0].Outcome)
	require.True(t, f.balance(1, "ETH").Equal(dec("99999999999999999999")))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id='huge'`))
}

func TestInitialBalanceIsFixedOnceJournaled(t *testing.T) {
	f := newFixture(t)
	f.user(1, map[string]string{"ETH": "3"})
	require.NoError(t, f.db.SetInitialBalance(context.Background(), 1, "ETH", dec("4")), "no journal yet: may be corrected")
	f.apply(f.enqueue("d", payment.Deposit, 1, "ETH", "1"))
	err := f.db.SetInitialBalance(context.Background(), 1, "ETH", dec("9"))
	require.ErrorIs(t, err, payment.ErrInvalid)
	require.True(t, f.balance(1, "ETH").Equal(dec("5")))
	f.requireJournalInvariant()
}

// TestJournalGuardsAnImpossibleState: an enqueued first-generation event
// whose journal row already exists (a state settle never produces: the
// row and the terminal status commit together) is refused loudly by the
// journal's unique constraint, and no money moves.
func TestJournalGuardsAnImpossibleState(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	task := f.enqueue("ghost", payment.Deposit, 1, "ETH", "1")
	_, err := f.sql.Exec(ctx, `INSERT INTO balances (user_id, asset, balance) VALUES (1, 'ETH', 1)
		ON CONFLICT (user_id, asset) DO UPDATE SET balance = 1`)
	require.NoError(t, err)
	_, err = f.sql.Exec(ctx, `INSERT INTO balance_events (user_id, asset, amount, event_type, source_event_id) VALUES (1, 'ETH', 1, 'deposit', 'ghost')`)
	require.NoError(t, err)
	_, err = f.db.ApplyBatch(ctx, []postgres.LedgerItem{{Event: task}}, postgres.LedgerOptions{})
	require.Error(t, err)
	require.NotErrorIs(t, err, payment.ErrRetryable, "not a transient condition: it must reach a human")
	require.True(t, f.balance(1, "ETH").Equal(dec("1")), "credited once")
	status, _ := f.status("ghost")
	require.Equal(t, payment.StatusEnqueued, status)
}

// TestLedgerSettingsAreNotPlannedPerTransaction: the ledger's timeouts
// ride in the plan settings' statement as literals, so it has no
// parameter to plan for; as a statement of their own with parameters,
// queued before the plan settings, they were planned afresh for every
// transaction (0.02 ms of PostgreSQL's planning per lone event in
// pg_stat_statements).
func TestLedgerSettingsAreNotPlannedPerTransaction(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	for i := range 8 {
		f.apply(f.enqueue(fmt.Sprintf("plan-%d", i), payment.Deposit, 1, "ETH", "1"))
	}
	custom, err := f.db.CustomPlans(ctx, "set_config('lock_timeout'")
	require.NoError(t, err)
	require.Zero(t, custom, "ledger_settings was planned per transaction")
}

// TestLedgerDeadLetterIsTheGenerationsFailure: the ledger's dead letter
// carries the key of the event's failure in its generation, so a worker's
// letter for the same failure, parked in the Redis fallback and drained
// afterwards, adds no second entry; and when the key names a row already
// there, the ids of the batch's other letters still go to their events.
func TestLedgerDeadLetterIsTheGenerationsFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.user(1, map[string]string{"ETH": "99999999999999999999"})
	f.user(2, map[string]string{"ETH": "99999999999999999999"})
	a := f.enqueue("huge-a", payment.Deposit, 1, "ETH", "1")
	b := f.enqueue("huge-b", payment.Deposit, 2, "ETH", "1")
	// A row of a's failure is there already, so the ledger's insert skips it.
	_, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: a.ID, EventType: string(a.Type), Error: "worker's",
		Generation: a.Generation, Source: payment.SourceDrain, FallbackID: payment.FailureKey(a.ID, a.Generation)}})
	require.NoError(t, err)

	results := f.apply(a, b)
	require.Equal(t, payment.OutcomeDeadLettered, results[0].Outcome)
	require.Equal(t, payment.OutcomeDeadLettered, results[1].Outcome)
	require.Zero(t, results[0].DeadLetterID, "a's entry was there before")
	require.NotZero(t, results[1].DeadLetterID)
	entry, err := f.db.DeadLetter(ctx, results[1].DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, b.ID, entry.Letter.EventID, "b's id is b's entry")
	require.Equal(t, payment.SourceLedger, entry.Letter.Source)

	// The worker's letter of b's failure drains from the fallback.
	ids, err := f.db.InsertDeadLetters(ctx, []payment.DeadLetter{{EventID: b.ID, EventType: string(b.Type), Error: "worker's",
		Generation: b.Generation, Source: payment.SourceDrain, FallbackID: payment.FailureKey(b.ID, b.Generation)}})
	require.NoError(t, err)
	require.Empty(t, ids)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'huge-a'`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM dead_letter_queue WHERE event_id = 'huge-b'`))
}

// TestFrozenWorkerLetsGoOfItsBalances: a worker cut off mid-transaction
// (a paused VM, a lost node: its socket neither answers nor resets) must
// not keep its balance rows locked until the kernel gives the socket up,
// hours later, failing every other worker's batch for those users. Here
// worker A locks user 7's balance, its event's lock is held elsewhere a
// moment so that A is frozen right after, with its transaction open;
// worker B must still apply its own deposit for user 7.
func TestFrozenWorkerLetsGoOfItsBalances(t *testing.T) {
	f := newFixture(t)
	f.user(7, map[string]string{"ETH": "10"})
	taskA := f.enqueue("frozen-a", payment.Deposit, 7, "ETH", "1")
	taskB := f.enqueue("frozen-b", payment.Deposit, 7, "ETH", "1")
	ctx := context.Background()

	holder, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM payment_events WHERE event_id = 'frozen-a' FOR UPDATE`)
	require.NoError(t, err)

	freezer, doneA := f.frozenMidTransaction(t, tx, func(workerA *postgres.DB) error {
		_, err := workerA.ApplyBatch(ctx, []postgres.LedgerItem{{Event: taskA}},
			postgres.LedgerOptions{LockTimeout: 10 * time.Second, StatementTimeout: 2 * time.Second})
		return err
	})
	f.requireAppliedWithin(t, taskB, "worker B's deposit")
	requireEndedWhileFrozen(t, freezer, doneA)
	status, _ := f.status("frozen-a")
	require.Equal(t, payment.StatusEnqueued, status, "A's event is left for its retry")
	f.apply(taskA)
	require.True(t, f.balance(7, "ETH").Equal(dec("12")), "each deposit credited once: %s", f.balance(7, "ETH"))
	f.requireJournalInvariant()
}
