package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/payment"
)

// CreateUser registers a user; false if it existed already.
func (db *DB) CreateUser(ctx context.Context, id int64) (bool, error) {
	if id <= 0 {
		return false, payment.Invalid("user id %d must be positive", id)
	}
	stmt := q("create_user")
	tag, err := db.pool.Exec(ctx, stmt.text, id)
	if err != nil {
		return false, classify(stmt.name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// UserExists reports whether the user is registered.
func (db *DB) UserExists(ctx context.Context, id int64) (bool, error) {
	stmt := q("user_exists")
	var ok bool
	err := db.pool.QueryRow(ctx, stmt.text, id).Scan(&ok)
	return ok, classify(stmt.name, err)
}

// SetInitialBalance seeds what a user held before settle's journal began;
// refused once the journal has a row for that balance.
func (db *DB) SetInitialBalance(ctx context.Context, user int64, asset string, amount decimal.Decimal) error {
	if amount.Sign() < 0 {
		return payment.Invalid("initial balance %s is negative", amount)
	}
	stmt := q("set_initial_balance")
	tag, err := db.pool.Exec(ctx, stmt.text, user, asset, amount.String())
	if err != nil {
		if isCode(err, codeForeignKeyViolation) {
			return fmt.Errorf("user %d or asset %s: %w", user, asset, payment.ErrInvalid)
		}
		// The balance would fall below what open holds keep (or below 0).
		if isCode(err, codeCheckViolation) {
			// Name the amount held, so the operator knows what to resolve
			// or the least they may set.
			held := "?"
			if bs, err := db.Balances(ctx, user); err == nil {
				for _, b := range bs {
					if b.Asset == asset {
						held = b.Held.String()
					}
				}
			}
			return payment.Invalid("initial balance %s of user %d in %s is below the %s the user's open holds keep: post or void them, or set at least that", amount, user, asset, held)
		}
		return classify(stmt.name, err)
	}
	if tag.RowsAffected() == 0 {
		return payment.Invalid("balance of user %d in %s already has journal entries; its initial balance is fixed", user, asset)
	}
	return nil
}

// Balance is one (asset, amount) of a user.
type Balance struct {
	Asset   string
	Balance decimal.Decimal
	// Held is the sum of the open holds; Available = Balance − Held is
	// what a debit may take.
	Held      decimal.Decimal
	Available decimal.Decimal
}

// Balances lists a user's balances.
func (db *DB) Balances(ctx context.Context, user int64) ([]Balance, error) {
	stmt := q("list_balances")
	rows, err := db.pool.Query(ctx, stmt.text, user)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	var out []Balance
	for rows.Next() {
		var b Balance
		var text, held string
		if err := rows.Scan(&b.Asset, &text, &held); err != nil {
			return nil, classify(stmt.name, err)
		}
		b.Balance, b.Held = decimal.RequireFromString(text), decimal.RequireFromString(held)
		b.Available = b.Balance.Sub(b.Held)
		out = append(out, b)
	}
	return out, classify(stmt.name, rows.Err())
}

// AddDepositAddress registers address (lowercase) on network for user.
// It reports true when newly registered, false when it already belonged
// to that user; payment.ErrConflict when it belongs to another.
func (db *DB) AddDepositAddress(ctx context.Context, network, address string, user int64) (bool, error) {
	var inserted, existing *int64
	var userExists bool
	var otherUser *int64
	var otherNetwork string
	err := pgx.BeginTxFunc(ctx, db.pool, bounded(pgx.TxOptions{}), func(tx pgx.Tx) error {
		stmt := q("lock_deposit_address")
		if _, err := tx.Exec(ctx, stmt.text, address); err != nil {
			return classify(stmt.name, err)
		}
		stmt = q("other_owner_of_address")
		err := tx.QueryRow(ctx, stmt.text, address, user).Scan(&otherUser, &otherNetwork)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return classify(stmt.name, err)
		}
		stmt = q("insert_deposit_address")
		if err := tx.QueryRow(ctx, stmt.text, network, address, user).Scan(&inserted, &existing, &userExists); err != nil {
			// The only foreign key a new row can break is its network's.
			if isCode(err, codeForeignKeyViolation) {
				return fmt.Errorf("%w %q", payment.ErrUnknownNetwork, network)
			}
			return classify(stmt.name, err)
		}
		return nil
	})
	if err != nil {
		return false, classifyTx("add deposit address", err)
	}
	switch {
	case otherUser != nil && otherNetwork != network:
		// One key on every EVM network: another user's address elsewhere
		// is another user's here too.
		return false, fmt.Errorf("address %s: %w: registered to another user on %s", address, payment.ErrConflict, otherNetwork)
	case otherUser != nil:
		return false, fmt.Errorf("address %s on %s: %w: registered to another user", address, network, payment.ErrConflict)
	case inserted != nil:
		return true, nil
	case existing != nil && *existing == user:
		return false, nil
	case existing != nil:
		return false, fmt.Errorf("address %s on %s: %w: registered to another user", address, network, payment.ErrConflict)
	case !userExists:
		return false, fmt.Errorf("%w %d", payment.ErrUnknownUser, user)
	}
	return false, payment.Retryable("insert_deposit_address", fmt.Errorf("address %s registered concurrently", address))
}

// DepositAddressOwners maps addresses (lowercase) on network to users.
func (db *DB) DepositAddressOwners(ctx context.Context, network string, addresses []string) (map[string]int64, error) {
	stmt := q("deposit_address_owners")
	rows, err := db.pool.Query(ctx, stmt.text, network, addresses)
	if err != nil {
		return nil, classify(stmt.name, err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var addr string
		var user int64
		if err := rows.Scan(&addr, &user); err != nil {
			return nil, classify(stmt.name, err)
		}
		out[addr] = user
	}
	return out, classify(stmt.name, rows.Err())
}

// UserHasDepositAddress tells whether user registered any address on
// network.
func (db *DB) UserHasDepositAddress(ctx context.Context, network string, user int64) (bool, error) {
	stmt := q("user_has_deposit_address")
	var has bool
	err := db.pool.QueryRow(ctx, stmt.text, network, user).Scan(&has)
	return has, classify(stmt.name, err)
}
