package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// Finding is the result of one invariant check.
type Finding struct {
	Invariant  string
	Violations int64
	Sample     string // up to ten offenders
}

// Conservation is one asset's money balance sheet.
type Conservation struct {
	Asset                              string
	Balances, Initial, Credits, Debits decimal.Decimal
	// Networks break Credits and Debits down by network.
	Networks []NetworkFlow
}

// Holds reports whether the asset's balances equal initial + credits - debits.
func (c Conservation) Holds() bool {
	return c.Balances.Equal(c.Initial.Add(c.Credits).Sub(c.Debits))
}

// InvariantOptions select the checks.
type InvariantOptions struct {
	// RequireTerminal also requires every event to be confirmed or failed
	// (true at the end of a run, false on a live system).
	RequireTerminal bool
	// PendingKeyAfter is how old a pending idempotency record may get.
	PendingKeyAfter time.Duration
}

var invariantChecks = []struct {
	name, query string
	// names, when set, are the findings of a statement that answers
	// several (count, sample) pairs in one row, in its column order.
	names    []string
	terminal bool
	arg      bool
}{
	{name: "balance = initial_balance + SUM(journal)", query: "inv_balance_journal"},
	{name: "journal rows match their events", query: "inv_journal_orphans"},
	{name: "one journal row per (source_event_id, event_type)", query: "inv_duplicate_journal"},
	{name: "confirmed events have a journal row", query: "inv_confirmed_without_journal"},
	{name: "only confirmed events have journal rows", query: "inv_journal_without_confirmed"},
	{name: "failed events have a DLQ row or a business outcome", query: "inv_failed_unexplained"},
	{name: "no idempotency record stuck pending", query: "inv_processed_pending", arg: true},
	{name: "open DLQ entries name stored events", query: "inv_dlq_unaccounted"},
	{name: "open holds fit in the balance, and held is their sum", query: "inv_open_holds"},
	{name: "open holds belong to a balance", query: "inv_holds_without_balance"},
	{name: "holds match their hold, post and void events", query: "inv_holds_match_events"},
	{name: "every confirmed withdrawal_hold has its holds row", query: "inv_holds_of_confirmed"},
	{name: "every confirmed post or void resolved its hold", query: "inv_hold_resolvers"},
	{name: "every confirmed post is on its hold's network", query: "inv_post_networks"},
	{name: "every confirmed void is on its hold's network", query: "inv_void_networks"},
	{name: "at most one confirmed post or void per hold", query: "inv_hold_resolved_once"},
	{query: "inv_reorg", names: []string{
		"reorg compensations and give-backs match their deposit",
		"a deposit is compensated at most once more than given back",
		"a credited deposit's chain_state follows its reorg cycle",
	}},
	{name: "every chain_transfers row names one confirmed deposit", query: "inv_transfer_claims"},
	{name: "no transfer is claimed under two spellings", query: "inv_transfer_spellings"},
	{name: "every payout_transfers row names one confirmed post", query: "inv_payout_claims"},
	{name: "every confirmed deposit with a tx_hash holds one transfer", query: "inv_deposits_without_transfer"},
	{name: "every accepted event is terminal", query: "inv_not_terminal", terminal: true},
}

// CheckInvariants runs every check on one REPEATABLE READ snapshot, so the
// findings describe a single committed state.
func (db *DB) CheckInvariants(ctx context.Context, o InvariantOptions) ([]Finding, []Conservation, error) {
	if o.PendingKeyAfter <= 0 {
		o.PendingKeyAfter = 10 * time.Minute
	}
	tx, err := db.pool.BeginTx(ctx, bounded(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}))
	if err != nil {
		return nil, nil, classify("check invariants", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var findings []Finding
	for _, c := range invariantChecks {
		if c.terminal && !o.RequireTerminal {
			continue
		}
		stmt := q(c.query)
		var args []any
		if c.arg {
			args = append(args, fmt.Sprintf("%d seconds", int64(o.PendingKeyAfter.Seconds())))
		}
		names := c.names
		if len(names) == 0 {
			names = []string{c.name}
		}
		found := make([]Finding, len(names))
		dest := make([]any, 0, 2*len(names))
		for i, name := range names {
			found[i].Invariant = name
			dest = append(dest, &found[i].Violations, &found[i].Sample)
		}
		if err := tx.QueryRow(ctx, stmt.text, args...).Scan(dest...); err != nil {
			return nil, nil, classify(stmt.name, err)
		}
		findings = append(findings, found...)
	}
	stmt := q("inv_conservation")
	rows, err := tx.Query(ctx, stmt.text)
	if err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var sheet []Conservation
	for rows.Next() {
		var c Conservation
		var b, i, cr, d string
		if err := rows.Scan(&c.Asset, &b, &i, &cr, &d); err != nil {
			return nil, nil, classify(stmt.name, err)
		}
		c.Balances, c.Initial, c.Credits, c.Debits = decimal.RequireFromString(b), decimal.RequireFromString(i), decimal.RequireFromString(cr), decimal.RequireFromString(d)
		sheet = append(sheet, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, classify(stmt.name, err)
	}
	rows.Close()
	if err := attachNetworkFlows(ctx, tx, sheet); err != nil {
		return nil, nil, err
	}
	return findings, sheet, nil
}
