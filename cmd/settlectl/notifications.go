package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("notifications", "notifications list [--state pending|delivered|failed|all] [--limit N] [--before ID] | redeliver ID [--operator NAME] | redeliver-failed [--limit N] [--operator NAME]", runNotifications)
}

func runNotifications(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("notifications", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: notifications list|redeliver|redeliver-failed", config.ErrUsage)
	}
	sub, args := args[0], args[1:]
	// Each subcommand defines only the flags it reads: a sibling's flag
	// (`redeliver 42 --state failed`) is refused, not taken and ignored.
	fs := flag.NewFlagSet("notifications "+sub, flag.ContinueOnError)
	state, before, limit := new(string), new(int64), new(int)
	*state, *limit = "all", postgres.NotificationPageDefault
	who, jsonOut := new(string), new(bool)
	limitFlag := func(usage string) {
		fs.IntVar(limit, "limit", postgres.NotificationPageDefault, fmt.Sprintf("%s, at most %d", usage, postgres.NotificationPageMax))
	}
	operatorFlag := func() { fs.StringVar(who, "operator", "", "who asks (default: your login name)") }
	var positional []string
	switch sub {
	case "list":
		fs.StringVar(state, "state", "all", "pending, delivered, failed or all")
		fs.Int64Var(before, "before", 0, "list notifications with an id below this (paging)")
		limitFlag("notifications per page")
		fs.BoolVar(jsonOut, "json", false, "print JSON, with every notification's delivery log")
	case "redeliver":
		positional = []string{"ID"}
		operatorFlag()
	case "redeliver-failed":
		limitFlag("notifications scheduled per statement")
		operatorFlag()
	default:
		return fmt.Errorf("%w: unknown notifications command %q", config.ErrUsage, sub)
	}
	rest, err := parseFlags(fs, args, positional...)
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > postgres.NotificationPageMax {
		return fmt.Errorf("%w: --limit must be 1..%d", config.ErrUsage, postgres.NotificationPageMax)
	}
	switch *state {
	case "pending", "delivered", "failed", "all":
	default:
		return fmt.Errorf("%w: --state must be pending, delivered, failed or all", config.ErrUsage)
	}
	id, err := optionalID(rest, "notification id")
	if err != nil {
		return err
	}
	if err := checkOperatorReason(*who, ""); err != nil {
		return err
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if sub == "redeliver-failed" {
		return redeliverFailed(ctx, db, *limit, operator(*who), out)
	}
	if sub == "redeliver" {
		result, err := db.RedeliverNotification(ctx, id, operator(*who))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "notification %d: %s\n", id, result)
		return nil
	}
	views, err := db.Notifications(ctx, *state, *before, *limit)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeJSON(out, views)
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDELIVERY\tUSER\tSTATUS\tATTEMPTS\tLAST ATTEMPT\tRESULT\tREDELIVERIES\tCREATED")
	for _, v := range views {
		last, result := "-", "-"
		if len(v.Log) > 0 {
			a := v.Log[0]
			last = a.At.UTC().Format(time.RFC3339)
			result = a.ErrorClass
			if a.HTTPStatus != 0 {
				result = "HTTP " + strconv.Itoa(a.HTTPStatus)
			}
			result += " in " + a.Duration.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%s\t%s\t%d\t%s\n", v.ID, v.DeliveryID, v.UserID, v.Status, v.Attempts, last, result,
			v.Redeliveries, v.CreatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// redeliverFailed sends every failed notification again, a page of limit
// at a time, until none is left; each page is its own statement, so an
// interrupted run has scheduled whole pages only.
func redeliverFailed(ctx context.Context, db *postgres.DB, limit int, who string, out io.Writer) error {
	var total int64
	for {
		scheduled, more, err := db.RedeliverFailedNotifications(ctx, limit, who)
		if err != nil {
			return fmt.Errorf("after %d scheduled: %w", total, err)
		}
		total += scheduled
		if !more || scheduled == 0 {
			fmt.Fprintf(out, "failed notifications scheduled again: %d\n", total)
			return nil
		}
	}
}
