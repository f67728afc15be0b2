package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

func TestGroupCommitMatchesSingleInserts(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ingest := postgres.NewIngest(f.db, 64, 2)
	defer ingest.Close()
	ctx := context.Background()
	event := func(id, amount string, user int64, asset string) postgres.NewEvent {
		return postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: asset, Amount: dec(amount), TraceID: "t"}}
	}
	type answer struct {
		inserted bool
		err      error
	}
	// Many goroutines at once, so batches mix new events, identical and
	// conflicting duplicates, and bad rows.
	const n = 200
	answers := make([]answer, 4*n)
	var wg sync.WaitGroup
	for i := range n {
		for j, e := range []postgres.NewEvent{
			event(fmt.Sprintf("g-%d", i), "1", 1, "ETH"),
			event(fmt.Sprintf("g-%d", i), "1.000", 1, "ETH"), // identical content
			event(fmt.Sprintf("g-%d", i), "2", 1, "ETH"),     // conflicting content
			event(fmt.Sprintf("bad-%d", i), "1", 999, "ETH"), // unknown user
		} {
			wg.Add(1)
			go func(k int, e postgres.NewEvent) {
				defer wg.Done()
				inserted, err := ingest.InsertEvent(ctx, e)
				answers[k] = answer{inserted, err}
			}(4*i+j, e)
		}
	}
	wg.Wait()
	for i := range n {
		first, same, other, bad := answers[4*i], answers[4*i+1], answers[4*i+2], answers[4*i+3]
		require.ErrorIs(t, bad.err, payment.ErrUnknownUser)
		inserts := 0
		for _, a := range []answer{first, same, other} {
			if a.inserted {
				inserts++
			}
		}
		require.Equal(t, 1, inserts, "exactly one delivery of g-%d stored", i)
		// Whichever content won, the other one is a conflict.
		if other.inserted {
			require.ErrorIs(t, first.err, payment.ErrConflict)
			require.ErrorIs(t, same.err, payment.ErrConflict)
		} else {
			require.ErrorIs(t, other.err, payment.ErrConflict, "g-%d: first %+v same %+v other %+v", i, first, same, other)
			require.NoError(t, first.err)
			require.NoError(t, same.err)
		}
	}
	require.Equal(t, n, f.count(`SELECT count(*) FROM payment_events`))
	require.Zero(t, f.count(`SELECT count(*) FROM payment_events WHERE user_id = 999`))
}

func TestGroupCommitAnswersUnavailableWhenPostgresIsDown(t *testing.T) {
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{})
	require.NoError(t, err)
	defer pg.Close()
	db, err := postgres.Open(ctx, pg.URL("postgres"), postgres.Options{ConnsMax: 4})
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Migrate(ctx)
	require.NoError(t, err)
	_, err = db.CreateUser(ctx, 1)
	require.NoError(t, err)
	ingest := postgres.NewIngest(db, 16, 2)
	defer ingest.Close()
	pg.Stop()
	_, err = ingest.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "x", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	require.ErrorIs(t, err, payment.ErrUnavailable)
	require.NoError(t, pg.Start(ctx))
	inserted, err := ingest.InsertEvent(ctx, postgres.NewEvent{Event: payment.Event{ID: "x", Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1")}})
	require.NoError(t, err)
	require.True(t, inserted, "nothing was half stored before")
}

// TestIngestFollowersOfARefusedLead: deliveries of one event id in one
// batch ride behind the first. When the first is refused for its own
// content (an unknown user), nothing is stored under the id: a follower
// with the same content shares the refusal, one naming a real user is
// stored (a 400 would lose it: providers do not retry), and the
// followers behind that one are its duplicates.
func TestIngestFollowersOfARefusedLead(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ingest := postgres.NewIngest(f.db, 64, 1)
	defer ingest.Close()
	ctx := context.Background()
	event := func(id string, user int64) postgres.NewEvent {
		return postgres.NewEvent{Event: payment.Event{ID: id, Type: payment.Deposit, UserID: user, Asset: "ETH", Amount: dec("1"), TraceID: "t"}}
	}

	// Hold the first batch on a lock, so that the requests after it
	// queue up, in order, and ride in the next batch together.
	locker, err := pgx.Connect(ctx, f.dsn)
	require.NoError(t, err)
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE users IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	type answer struct {
		inserted bool
		err      error
	}
	requests := []postgres.NewEvent{
		event("warm-up", 1),
		event("x-1", 999), // the lead: an unknown user
		event("x-1", 999), // the same content
		event("x-1", 1),   // a real user
		event("x-1", 1),   // its redelivery
	}
	answers := make([]chan answer, len(requests))
	for i, e := range requests {
		answers[i] = make(chan answer, 1)
		go func() {
			inserted, err := ingest.InsertEvent(ctx, e)
			answers[i] <- answer{inserted, err}
		}()
		time.Sleep(300 * time.Millisecond) // queued in this order
	}
	require.NoError(t, tx.Rollback(ctx))

	require.NoError(t, (<-answers[0]).err)
	require.ErrorIs(t, (<-answers[1]).err, payment.ErrUnknownUser)
	require.ErrorIs(t, (<-answers[2]).err, payment.ErrUnknownUser, "the same content, the same refusal")
	stored := <-answers[3]
	require.NoError(t, stored.err, "user 1 exists and nothing was stored under x-1")
	require.True(t, stored.inserted)
	again := <-answers[4]
	require.NoError(t, again.err)
	require.False(t, again.inserted, "a duplicate of the one stored")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM payment_events WHERE event_id = 'x-1' AND user_id = 1`))
}

// TestInsertMatchesContentAsSent: a row stored under the content as its
// sender wrote it is the same delivery as one that now arrives filled in
// and names that content's hash (SentAs), alone or in a batch; without
// it, or naming another, it is a conflict.
func TestInsertMatchesContentAsSent(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	asSent := payment.Event{ID: "p-1", Type: payment.WithdrawalPost, UserID: 1, Asset: "ETH", Amount: dec("0"), HoldID: "h-1", Network: payment.DefaultNetwork, TraceID: "t"}
	inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: asSent})
	require.NoError(t, err)
	require.True(t, inserted)
	filled := asSent
	filled.Asset, filled.Amount = "USDC", dec("1.5")

	ingest := postgres.NewIngest(f.db, 64, 1)
	defer ingest.Close()
	for name, insert := range map[string]func(context.Context, postgres.NewEvent) (bool, error){"alone": f.db.InsertEvent, "in a batch": ingest.InsertEvent} {
		inserted, err = insert(ctx, postgres.NewEvent{Event: filled, SentAs: [][]byte{asSent.Content().Hash()}})
		require.NoError(t, err, name)
		require.False(t, inserted, name)
		_, err = insert(ctx, postgres.NewEvent{Event: filled})
		require.ErrorIs(t, err, payment.ErrConflict, name)
		other := asSent
		other.Amount = dec("2")
		_, err = insert(ctx, postgres.NewEvent{Event: filled, SentAs: [][]byte{other.Content().Hash()}})
		require.ErrorIs(t, err, payment.ErrConflict, name)
	}
}
