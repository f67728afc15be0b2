package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/settle/settle/pkg/alert"
	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/finality"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/postgres"
)

func init() {
	register("events", "events recheck ID [--operator NAME] | rechecks ID: ask the chain again about a failed deposit", runEvents)
}

// errNoRPC: settlectl asks the chain itself, with the worker's settings.
var errNoRPC = errors.New("ETH_RPC_URL is not set: a recheck asks the chain; set ETH_RPC_URL (and DEPOSIT_FINALITY as the worker has it)")

func runEvents(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("events", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: events recheck ID | rechecks ID", config.ErrUsage)
	}
	sub, args := args[0], args[1:]
	if sub != "recheck" && sub != "rechecks" {
		return fmt.Errorf("%w: unknown events command %q", config.ErrUsage, sub)
	}
	fs := flag.NewFlagSet("events "+sub, flag.ContinueOnError)
	jsonOut := fs.Bool("json", false, "print JSON")
	who := new(string)
	if sub == "recheck" { // rechecks only reads: it names no one
		fs.StringVar(who, "operator", "", "who asks (default: your login name)")
	}
	rest, err := parseFlags(fs, args, "ID")
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
	if sub == "rechecks" {
		history, err := db.Rechecks(ctx, rest[0])
		if err != nil {
			return err
		}
		if *jsonOut {
			views := make([]postgres.RecheckView, 0, len(history))
			for _, r := range history {
				views = append(views, r.View())
			}
			return writeJSON(out, views)
		}
		printRechecks(out, history)
		return nil
	}
	r, err := recheck(ctx, db, rest[0], operator(*who))
	if r.ID == 0 {
		return err
	}
	if *jsonOut {
		if jsonErr := writeJSON(out, r.View()); jsonErr != nil {
			return jsonErr
		}
	} else {
		fmt.Fprintf(out, "event %s: %s, now %s\nthe chain shows: %s: %s\nrecorded as recheck %d by %s at %s\n",
			r.EventID, r.Result, r.Status, r.ChainState, r.Detail, r.ID, r.RequestedBy, r.CreatedAt.UTC().Format(time.RFC3339))
	}
	return err
}

// recheck runs the api's recheck (finality.OpenRechecker) with this
// environment's chain settings, read exactly as the worker reads them.
func recheck(ctx context.Context, db *postgres.DB, eventID, who string) (postgres.Recheck, error) {
	env := config.FromOS()
	s := finality.ReadSettings(env, false)
	// At a prompt only warnings and worse, unless LOG_LEVEL asks for more.
	level := config.Parse(env, "LOG_LEVEL", zerolog.WarnLevel, logging.ParseLevel)
	if err := env.Err(); err != nil {
		return postgres.Recheck{}, fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	if !s.HasRPC() {
		return postgres.Recheck{}, errNoRPC
	}
	assets, err := db.Assets(ctx)
	if err != nil {
		return postgres.Recheck{}, err
	}
	// What the breaker says goes to stderr; settlectl has no alert webhook.
	log := zerolog.New(os.Stderr).Level(level).With().Timestamp().Logger()
	alerts := alert.New(log, alert.Options{Service: "settlectl"})
	defer alerts.Close()
	rechecker, closeChain, err := finality.OpenRechecker(ctx, s, finality.Deps{Store: db, Assets: assets, Alerts: alerts, Log: log}, db)
	if err != nil {
		return postgres.Recheck{}, err
	}
	defer closeChain()
	return rechecker.Recheck(ctx, eventID, who)
}

func printRechecks(out io.Writer, history []postgres.Recheck) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tBY\tCHAIN\tRESULT\tDETAIL")
	for _, r := range history {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.CreatedAt.UTC().Format(time.RFC3339), r.RequestedBy, r.ChainState, r.Result, r.Detail)
	}
	_ = tw.Flush()
}
