package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/money"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("holds", "holds list [--user N] [--status open|posted|voided] [--limit N] | show ID: withdrawal holds", runHolds)
}

func runHolds(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("holds", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: holds list | show ID", config.ErrUsage)
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("holds "+sub, flag.ContinueOnError)
	jsonOut := fs.Bool("json", false, "print JSON")
	var positional []string
	var filter postgres.HoldFilter
	var status *string
	switch sub {
	case "list":
		fs.Int64Var(&filter.UserID, "user", 0, "only this user's holds")
		status = fs.String("status", "", "open, posted or voided")
		fs.IntVar(&filter.Limit, "limit", 100, fmt.Sprintf("holds to list, newest first (at most %d)", postgres.HoldsListMax))
	case "show":
		positional = []string{"ID"}
	default:
		return fmt.Errorf("%w: unknown holds command %q", config.ErrUsage, sub)
	}
	rest, err := parseFlags(fs, args, positional...)
	if err != nil {
		return err
	}
	if status != nil && *status != "" {
		filter.Status = payment.HoldStatus(*status)
		if !filter.Status.Valid() {
			return fmt.Errorf("%w: --status must be open, posted or voided", config.ErrUsage)
		}
	}
	if status != nil && (filter.Limit < 1 || filter.Limit > postgres.HoldsListMax) || filter.UserID < 0 {
		return fmt.Errorf("%w: --limit is 1 to %d, --user above zero", config.ErrUsage, postgres.HoldsListMax)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	var holds []postgres.Hold
	if sub == "show" {
		h, err := db.Hold(ctx, rest[0])
		if err != nil {
			return err
		}
		holds = []postgres.Hold{h}
	} else if holds, err = db.Holds(ctx, filter); err != nil {
		return err
	}
	if *jsonOut {
		if sub == "show" {
			return writeJSON(out, holds[0].View())
		}
		views := make([]postgres.HoldView, 0, len(holds)) // [] for none, not null
		for _, h := range holds {
			views = append(views, h.View())
		}
		return writeJSON(out, views)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "HOLD\tUSER\tASSET\tAMOUNT\tNETWORK\tTO\tSTATUS\tCREATED\tRESOLVED BY")
	for _, h := range holds {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.ID, h.UserID, h.Asset, money.Canonical(h.Amount), h.Network,
			dash(h.ToAddress), h.Status, h.CreatedAt.UTC().Format(time.RFC3339), dash(h.ResolvedBy))
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
