package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// waiting is a deposit on network ("": a row from before networks)
// whose re-check is due at now() + dueIn.
type waiting struct {
	id, network string
	dueIn       time.Duration
}

// park stores the deposits, claims them and parks them in
// awaiting_finality, each due when it says.
func (f *fixture) park(deposits []waiting) {
	f.t.Helper()
	ctx := context.Background()
	for i, w := range deposits {
		e := payment.Event{ID: w.id, Type: payment.Deposit, UserID: 1, Asset: "ETH", Amount: dec("1"),
			TxHash: fmt.Sprintf("0x%064x", 0x1000+i), TraceID: "trace-" + w.id, Network: w.network}
		inserted, err := f.db.InsertEvent(ctx, postgres.NewEvent{Event: e, Source: postgres.SourcePayments})
		require.NoError(f.t, err)
		require.True(f.t, inserted)
	}
	claimed, err := f.db.ClaimOutbox(ctx, len(deposits), 0, postgres.TaskEventsMax)
	require.NoError(f.t, err)
	require.Len(f.t, claimed, len(deposits))
	for _, c := range claimed {
		moved, err := f.db.AwaitFinality(ctx, c.Event, postgres.Wait{RecheckIn: time.Hour, Note: "not final"})
		require.NoError(f.t, err)
		require.True(f.t, moved)
	}
	for _, w := range deposits {
		_, err = f.sql.Exec(ctx, `UPDATE payment_events SET next_check_at = now() + $2 * interval '1 millisecond' WHERE event_id = $1`,
			w.id, w.dueIn.Milliseconds())
		require.NoError(f.t, err)
	}
}

func claimedIDs(claimed []postgres.Claimed) []string {
	var ids []string
	for _, c := range claimed {
		ids = append(ids, c.Event.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestDueClaimTakesNetworksInTurn: the waiting deposits due are claimed
// network by network in turns, each network's longest due first: 30 on
// ETH_MAINNET due before the one on BASE_MAINNET and the one from before
// networks leave them each their turn in the first claim, and a claim
// only ETH has due deposits for is ETH's alone (no share is left unused).
// The row-by-row fallback chooses the same.
func TestDueClaimTakesNetworksInTurn(t *testing.T) {
	claims := map[string]func(*postgres.DB, int) ([]postgres.Claimed, error){
		"claim": func(db *postgres.DB, dueMax int) ([]postgres.Claimed, error) {
			return db.ClaimOutbox(context.Background(), 0, dueMax, postgres.TaskEventsMax)
		},
		"row by row": func(db *postgres.DB, dueMax int) ([]postgres.Claimed, error) {
			return db.ClaimRowByRow(context.Background(), 0, dueMax)
		},
	}
	for name, claim := range claims {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.user(1, nil)
			var deposits []waiting
			for i := range 30 {
				deposits = append(deposits, waiting{fmt.Sprintf("eth-%02d", i), "ETH_MAINNET", -time.Hour + time.Duration(i)*time.Second})
			}
			f.park(append(deposits,
				waiting{"base-due", "BASE_MAINNET", -time.Minute},
				waiting{"base-later", "BASE_MAINNET", time.Hour},
				waiting{"legacy", "", -time.Second}))

			none, err := claim(f.db, 0)
			require.NoError(t, err)
			require.Empty(t, none, "no room for re-checks, none claimed")

			first, err := claim(f.db, 10)
			require.NoError(t, err)
			want := []string{"base-due", "legacy"}
			for i := range 8 {
				want = append(want, fmt.Sprintf("eth-%02d", i))
			}
			slices.Sort(want)
			require.Equal(t, want, claimedIDs(first), "each network its turn, then ETH's longest due")

			second, err := claim(f.db, 10)
			require.NoError(t, err)
			want = nil
			for i := 8; i < 18; i++ {
				want = append(want, fmt.Sprintf("eth-%02d", i))
			}
			require.Equal(t, want, claimedIDs(second), "only ETH has deposits due: the claim is all ETH's")
		})
	}
}

// TestDueClaimWalksTheNetworksIndex: under the hot path's generic plan,
// the claim finds the networks and each one's due deposits in
// payment_events_awaiting_network, however many wait.
func TestDueClaimWalksTheNetworksIndex(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tx, err := f.sql.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, postgres.QueryText("hot_path_plans"))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE claim(int, int, int) AS "+postgres.QueryText("claim_outbox"))
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN EXECUTE claim(500, 100, 32)`)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	require.NotContains(t, text, "Seq Scan on payment_events", text)
	require.Equal(t, 3, strings.Count(text, "Index Scan using payment_events_awaiting_network"), text)
}
