package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/payment"
)

// TestDatabaseMirrorsHoldTransitions tries every (from, to) pair of hold
// statuses against PostgreSQL and requires the CHECKs and the trigger to
// agree with payment.HoldStatus.CanTransition.
func TestDatabaseMirrorsHoldTransitions(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, from := range payment.HoldStatuses {
		for _, to := range payment.HoldStatuses {
			tx, err := f.sql.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO holds (hold_id, user_id, asset, amount, network) VALUES ('edge', 1, 'ETH', 1, 'ETH_MAINNET')`)
			require.NoError(t, err)
			if from != payment.HoldOpen {
				_, err = tx.Exec(ctx, `UPDATE holds SET status = $1, resolved_at = now(), resolved_by = 'r' WHERE hold_id = 'edge'`, string(from))
				require.NoError(t, err, "walking to %s", from)
			}
			// Set the resolution columns as the status needs them, so only
			// the transition guard can refuse the move.
			_, err = tx.Exec(ctx, `UPDATE holds SET status = $1,
				resolved_at = CASE WHEN $1 = 'open' THEN NULL ELSE now() END,
				resolved_by = CASE WHEN $1 = 'open' THEN NULL ELSE 'r2' END WHERE hold_id = 'edge'`, string(to))
			allowed := err == nil
			if err != nil {
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "%s → %s: %v", from, to, err)
				require.Equal(t, "23514", pgErr.Code)
				require.Contains(t, pgErr.Message, "is not allowed", "%s → %s refused by another constraint: %v", from, to, err)
			}
			require.Equal(t, from.CanTransition(to), allowed, "%s → %s: Go table and database disagree", from, to)
			require.NoError(t, tx.Rollback(ctx))
		}
	}
}

func TestHoldConstraints(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for name, statement := range map[string]string{
		"inserted resolved":      `INSERT INTO holds (hold_id, user_id, asset, amount, network, status, resolved_at, resolved_by) VALUES ('x', 1, 'ETH', 1, 'ETH_MAINNET', 'posted', now(), 'p')`,
		"open with a resolution": `INSERT INTO holds (hold_id, user_id, asset, amount, network, resolved_by) VALUES ('x', 1, 'ETH', 1, 'ETH_MAINNET', 'p')`,
		"zero amount":            `INSERT INTO holds (hold_id, user_id, asset, amount, network) VALUES ('x', 1, 'ETH', 0, 'ETH_MAINNET')`,
		"mixed-case address":     `INSERT INTO holds (hold_id, user_id, asset, amount, network, to_address) VALUES ('x', 1, 'ETH', 1, 'ETH_MAINNET', '0x00000000000000000000000000000000000000AB')`,
		"unknown status":         `INSERT INTO holds (hold_id, user_id, asset, amount, network, status) VALUES ('x', 1, 'ETH', 1, 'ETH_MAINNET', 'pending')`,
	} {
		_, err := f.sql.Exec(ctx, statement)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
		require.Equal(t, "23514", pgErr.Code, name)
	}
	// A resolved hold's facts never change, nor does it resolve again.
	_, err := f.sql.Exec(ctx, `INSERT INTO holds (hold_id, user_id, asset, amount, network) VALUES ('h', 1, 'ETH', 1, 'ETH_MAINNET')`)
	require.NoError(t, err)
	_, err = f.sql.Exec(ctx, `UPDATE holds SET amount = 2 WHERE hold_id = 'h'`)
	require.ErrorContains(t, err, "is not allowed")
	_, err = f.sql.Exec(ctx, `UPDATE holds SET status = 'voided', resolved_at = now(), resolved_by = 'v' WHERE hold_id = 'h'`)
	require.NoError(t, err)
	_, err = f.sql.Exec(ctx, `UPDATE holds SET resolved_by = 'v2' WHERE hold_id = 'h'`)
	require.ErrorContains(t, err, "is not allowed")
}

func TestHoldOutcomesBelongToTheirTypes(t *testing.T) {
	f := newFixture(t)
	f.user(1, nil)
	ctx := context.Background()
	for name, c := range map[string]struct {
		typ, status, outcome string
		ok                   bool
	}{
		"held hold":              {"withdrawal_hold", "confirmed", "held", true},
		"held withdrawal":        {"withdrawal", "confirmed", "held", false},
		"failed held":            {"withdrawal_hold", "failed", "held", false},
		"closed post":            {"withdrawal_post", "failed", "hold_closed", true},
		"unknown void":           {"withdrawal_void", "failed", "unknown_hold", true},
		"closed withdrawal":      {"withdrawal", "failed", "hold_closed", false},
		"confirmed unknown post": {"withdrawal_post", "confirmed", "unknown_hold", false},
	} {
		tx, err := f.sql.Begin(ctx)
		require.NoError(t, err)
		hold := any(nil)
		if c.typ == "withdrawal_post" || c.typ == "withdrawal_void" {
			hold = "h"
		}
		_, err = tx.Exec(ctx, `INSERT INTO payment_events (event_id, event_type, user_id, asset, amount, content_hash, hold_id)
			VALUES ('o', $1, 1, 'ETH', 1, decode(repeat('00', 32), 'hex'), $2)`, c.typ, hold)
		require.NoError(t, err, name)
		_, err = tx.Exec(ctx, `UPDATE payment_events SET status = 'enqueued' WHERE event_id = 'o'`)
		require.NoError(t, err, name)
		_, err = tx.Exec(ctx, `UPDATE payment_events SET status = $1, outcome = $2 WHERE event_id = 'o'`, c.status, c.outcome)
		require.Equal(t, c.ok, err == nil, "%s: %v", name, err)
		require.NoError(t, tx.Rollback(ctx))
	}
}
