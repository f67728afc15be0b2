package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
)

func init() {
	register("migrate", "apply pending database migrations (idempotent)", runMigrate)
	register("users", "users create ID [--initial ASSET=AMOUNT ...]", runUsers)
	register("addresses", "addresses add --network N --address 0x... --user ID", runAddresses)
	register("check", "check every invariant; exit 1 on any violation", runCheck)
}

func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	if _, err := parseFlags(flag.NewFlagSet("migrate", flag.ContinueOnError), args); err != nil {
		return err
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	applied, err := db.Migrate(ctx)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(out, "schema is current")
	}
	for _, name := range applied {
		fmt.Fprintln(out, "applied", name)
	}
	return nil
}

// multiFlag collects repeated --initial flags.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runUsers(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("users", args); err != nil {
		return err
	}
	if len(args) == 0 || args[0] != "create" {
		return fmt.Errorf("%w: users create ID [--initial ASSET=AMOUNT ...]", config.ErrUsage)
	}
	fs := flag.NewFlagSet("users create", flag.ContinueOnError)
	var initial multiFlag
	fs.Var(&initial, "initial", "ASSET=AMOUNT held before settle's journal began (repeatable)")
	rest, err := parseFlags(fs, args[1:], "ID")
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(rest[0], 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("%w: user id %q must be a positive integer", config.ErrUsage, rest[0])
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	registry, err := db.Assets(ctx)
	if err != nil {
		return err
	}
	// Every --initial is checked before anything is written: a refused
	// command changes nothing.
	type balance struct {
		code   string
		amount decimal.Decimal
	}
	balances := make([]balance, 0, len(initial))
	for _, spec := range initial {
		code, amountText, ok := strings.Cut(spec, "=")
		if !ok {
			return fmt.Errorf("%w: --initial %q is not ASSET=AMOUNT", config.ErrUsage, spec)
		}
		// The ledger holds any code at the finest precision it has on
		// any network.
		decimals, known := registry.Precision(code)
		if !known {
			return fmt.Errorf("%w: %w %q", config.ErrUsage, payment.ErrUnknownAsset, code)
		}
		amount, err := money.Parse(amountText, decimals)
		if err != nil {
			return fmt.Errorf("%w: --initial %s: %w", config.ErrUsage, code, err)
		}
		balances = append(balances, balance{code, amount})
	}
	created, err := db.CreateUser(ctx, id)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "user %d created\n", id)
	} else {
		fmt.Fprintf(out, "user %d exists\n", id)
	}
	// Said per asset: on a user that exists, --initial still sets the
	// balance (moving it by the difference), which "exists" alone hides.
	for _, b := range balances {
		if err := db.SetInitialBalance(ctx, id, b.code, b.amount); err != nil {
			return err
		}
		fmt.Fprintf(out, "user %d: initial %s balance set to %s\n", id, b.code, money.Canonical(b.amount))
	}
	return nil
}

var addressPattern = regexp.MustCompile(`^0x[0-9a-fA-F]{40}$`)

func runAddresses(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("addresses", args); err != nil {
		return err
	}
	if len(args) == 0 || args[0] != "add" {
		return fmt.Errorf("%w: addresses add --network N --address 0x... --user ID", config.ErrUsage)
	}
	fs := flag.NewFlagSet("addresses add", flag.ContinueOnError)
	network := fs.String("network", "ETH_MAINNET", "network of the address")
	address := fs.String("address", "", "0x + 40 hex digits")
	user := fs.Int64("user", 0, "owner")
	if _, err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	// Checked here, as POST /admin/deposit-addresses does: the table's
	// CHECK constraint would answer with PostgreSQL's words.
	if !payment.ValidNetworkName(*network) {
		return fmt.Errorf("%w: --network %q is not a network name like ETH_MAINNET", config.ErrUsage, *network)
	}
	if !addressPattern.MatchString(*address) {
		return fmt.Errorf("%w: --address %q is not 0x and 40 hex digits", config.ErrUsage, *address)
	}
	if *user <= 0 {
		return fmt.Errorf("%w: --user must be a positive id", config.ErrUsage)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	created, err := db.AddDepositAddress(ctx, *network, strings.ToLower(*address), *user)
	if errors.Is(err, payment.ErrUnknownNetwork) {
		return fmt.Errorf("%w: %w (settlectl networks add first)", config.ErrUsage, err)
	}
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "%s on %s registered to user %d\n", strings.ToLower(*address), *network, *user)
	} else {
		fmt.Fprintf(out, "%s on %s already belongs to user %d\n", strings.ToLower(*address), *network, *user)
	}
	return nil
}

func runCheck(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	quiet := fs.Bool("require-terminal", false, "also require every event to be confirmed or failed (for a quiesced system)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	opts := invariant.Options{RequireTerminal: *quiet}
	report, err := invariant.Check(ctx, db, opts)
	if err != nil {
		return err
	}
	if *jsonOut {
		if err := writeJSON(out, report.JSON()); err != nil {
			return err
		}
	} else {
		fmt.Fprint(out, report.String())
	}
	if !report.OK() {
		return errCheckFailed
	}
	return nil
}
