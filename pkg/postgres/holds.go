package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

// HoldsListMax bounds one listing of holds.
const HoldsListMax = 1000

// Hold is a holds row.
type Hold struct {
	ID         string
	UserID     int64
	Asset      string
	Amount     decimal.Decimal
	Network    string
	ToAddress  string
	Status     payment.HoldStatus
	CreatedAt  time.Time
	ResolvedAt *time.Time
	ResolvedBy string
}

// HoldView is a hold as GET /v1/holds/{hold_id} answers it and
// settlectl's --json prints it: the table's columns, amounts as strings,
// null for what is not there.
type HoldView struct {
	HoldID     string     `json:"hold_id"`
	UserID     int64      `json:"user_id"`
	Asset      string     `json:"asset"`
	Amount     string     `json:"amount"`
	Network    string     `json:"network"`
	ToAddress  *string    `json:"to_address"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"created_at"`
	ResolvedAt *time.Time `json:"resolved_at"`
	ResolvedBy *string    `json:"resolved_by"`
}

// View is h as HoldView, times in UTC.
func (h Hold) View() HoldView {
	out := HoldView{HoldID: h.ID, UserID: h.UserID, Asset: h.Asset, Amount: money.Canonical(h.Amount), Network: h.Network,
		Status: string(h.Status), CreatedAt: h.CreatedAt.UTC()}
	if h.ToAddress != "" {
		out.ToAddress = &h.ToAddress
	}
	if h.ResolvedAt != nil {
		at := h.ResolvedAt.UTC()
		out.ResolvedAt = &at
	}
	if h.ResolvedBy != "" {
		out.ResolvedBy = &h.ResolvedBy
	}
	return out
}

// HoldEvent is what a withdrawal_hold event says, before or after the
// ledger applied it.
type HoldEvent struct {
	UserID    int64
	Asset     string
	Amount    decimal.Decimal
	Network   string
	ToAddress string
}

// HoldEventOf reads the withdrawal_hold event with the given id; found is
// false when there is none.
func (db *DB) HoldEventOf(ctx context.Context, holdID string) (HoldEvent, bool, error) {
	stmt := q("hold_event")
	var h HoldEvent
	var amount string
	err := db.pool.QueryRow(ctx, stmt.text, holdID).Scan(&h.UserID, &h.Asset, &amount, &h.Network, &h.ToAddress)
	if errors.Is(err, pgx.ErrNoRows) {
		return HoldEvent{}, false, nil
	}
	if err != nil {
		return HoldEvent{}, false, classify(stmt.name, err)
	}
	h.Amount = decimal.RequireFromString(amount)
	return h, true, nil
}

// Hold reads one hold; payment.ErrNotFound when there is none.
func (db *DB) Hold(ctx context.Context, holdID string) (Hold, error) {
	stmt := q("get_hold")
	h, err := scanHold(db.pool.QueryRow(ctx, stmt.text, holdID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Hold{}, fmt.Errorf("hold %s: %w", holdID, payment.ErrNotFound)
	}
	return h, classify(stmt.name, err)
}

// HoldFilter selects holds to list; zero values select all.
type HoldFilter struct {
	UserID int64
	Status payment.HoldStatus
	Limit  int
}

// Holds lists holds newest first, at most HoldsListMax.
func (db *DB) Holds(ctx context.Context, f HoldFilter) ([]Hold, error) {
	if f.Limit <= 0 || f.Limit > HoldsListMax {
		f.Limit = HoldsListMax
	}
	stmt := q("list_holds")
	rows, err := db.pool.Query(ctx, stmt.text, f.UserID, string(f.Status), f.Limit)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var out []Hold
	for rows.Next() {
		h, err := scanHold(rows)
		if err != nil {
			return nil, classify(stmt.name, err)
		}
		out = append(out, h)
	}
	return out, classify(stmt.name, rows.Err())
}

func scanHold(row pgx.Row) (Hold, error) {
	var h Hold
	var amount, status string
	if err := row.Scan(&h.ID, &h.UserID, &h.Asset, &amount, &h.Network, &h.ToAddress, &status,
		&h.CreatedAt, &h.ResolvedAt, &h.ResolvedBy); err != nil {
		return Hold{}, err
	}
	h.Amount, h.Status = decimal.RequireFromString(amount), payment.HoldStatus(status)
	return h, nil
}
