package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/dlq"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/service"
)

func init() {
	register("dlq", "dlq list [--state open|resolved|all] | show ID | replay ID [--reason R] | discard ID --reason R", runDLQ)
	register("reconcile", "full reconciliation of every balance now; exit 1 on any mismatch", runReconcile)
}

// operator names who acts: --operator, else the login name.
func operator(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username + " (settlectl)"
	}
	return "settlectl"
}

func runDLQ(ctx context.Context, args []string, out io.Writer) error {
	if err := groupHelp("dlq", args); err != nil {
		return err
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: dlq list|show|replay|discard", config.ErrUsage)
	}
	sub, args := args[0], args[1:]
	// Each subcommand defines only the flags it reads: a sibling's flag
	// (`dlq list --reason x`) is refused, not taken and ignored.
	fs := flag.NewFlagSet("dlq "+sub, flag.ContinueOnError)
	state, after, limit := new(string), new(int64), new(int)
	*state, *limit = "open", postgres.DeadLetterPageDefault
	reason, who, jsonOut := new(string), new(string), new(bool)
	var positional []string
	switch sub {
	case "list":
		fs.StringVar(state, "state", "open", "open, resolved or all")
		fs.Int64Var(after, "after", 0, "list entries with an id above this (paging)")
		fs.IntVar(limit, "limit", postgres.DeadLetterPageDefault, fmt.Sprintf("entries per page, at most %d", postgres.DeadLetterPageMax))
		fs.BoolVar(jsonOut, "json", false, "print JSON")
	case "show":
		positional = []string{"ID"}
		fs.BoolVar(jsonOut, "json", false, "print JSON (show always does)")
	case "replay", "discard":
		positional = []string{"ID"}
		why := "why, recorded with the entry"
		if sub == "discard" {
			why = "why (required), recorded with the entry"
		}
		fs.StringVar(reason, "reason", "", why)
		fs.StringVar(who, "operator", "", "who acts (default: your login name)")
	default:
		return fmt.Errorf("%w: unknown dlq command %q", config.ErrUsage, sub)
	}
	rest, err := parseFlags(fs, args, positional...)
	if err != nil {
		return err
	}
	id, err := optionalID(rest, "DLQ entry id")
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > postgres.DeadLetterPageMax {
		return fmt.Errorf("%w: --limit must be 1..%d", config.ErrUsage, postgres.DeadLetterPageMax)
	}
	if *state != "open" && *state != "resolved" && *state != "all" {
		return fmt.Errorf("%w: --state must be open, resolved or all", config.ErrUsage)
	}
	if err := checkOperatorReason(*who, *reason); err != nil {
		return err
	}
	var fallbackURL string
	if sub == "list" && !*jsonOut && *state != "resolved" {
		if fallbackURL, err = redisURL(); err != nil {
			return err
		}
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	switch sub {
	case "list":
		entries, err := db.DeadLetters(ctx, *state, *after, *limit)
		if err != nil {
			return err
		}
		if *jsonOut {
			return writeJSON(out, entries)
		}
		if fallbackURL != "" {
			defer fmt.Fprintln(out, fallbackNote(ctx, fallbackURL))
		}
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT\tTYPE\tUSER\tAMOUNT\tSOURCE\tATTEMPT\tEVENT STATUS\tRESOLUTION\tCREATED\tERROR")
		for _, e := range entries {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s %s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.ID, e.Letter.EventID, e.Letter.EventType, e.Letter.UserID,
				e.Letter.Amount, e.Letter.Asset, e.Letter.Source, e.Letter.Attempt, orDash(e.EventStatus), orDash(e.Resolution),
				e.Letter.CreatedAt.UTC().Format(time.RFC3339), truncate(e.Letter.Error, 80))
		}
		return tw.Flush()
	case "show":
		e, err := db.DeadLetter(ctx, id)
		if err != nil {
			return err
		}
		return writeJSON(out, e)
	case "replay":
		result, err := db.ReplayDeadLetter(ctx, id, operator(*who), *reason)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "dead letter %d: %s\n", id, result)
		return nil
	default: // discard
		// Blank is no reason, as POST /admin/dlq/{id}/discard has it.
		if strings.TrimSpace(*reason) == "" {
			return fmt.Errorf("%w: discard needs --reason", config.ErrUsage)
		}
		changed, err := db.DiscardDeadLetter(ctx, id, operator(*who), *reason)
		if err != nil {
			return err
		}
		if changed {
			fmt.Fprintf(out, "dead letter %d: discarded\n", id)
		} else {
			fmt.Fprintf(out, "dead letter %d: already discarded\n", id)
		}
		return nil
	}
}

// redisURL is REDIS_URL (the services' default when unset), checked as
// the services check it.
func redisURL() (string, error) {
	env := config.FromOS()
	raw := env.String("REDIS_URL", service.RedisURLDefault)
	if _, err := redisconn.Parse(raw); err != nil {
		env.Reject("REDIS_URL", err)
	}
	if err := env.Err(); err != nil {
		return "", fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	return raw, nil
}

// fallbackReadWait bounds dlq list's look at the Redis fallback, which is
// only a footnote to the list.
const fallbackReadWait = 2 * time.Second

// fallbackNote says how many dead letters wait in the Redis fallback (the
// workers park one there while PostgreSQL refuses it), which the list
// above does not show until the scheduler's drain_dlq moves them.
func fallbackNote(ctx context.Context, url string) string {
	rdb, err := redisconn.Open(url)
	if err == nil {
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(ctx, fallbackReadWait)
		defer cancel()
		var n int64
		if n, err = dlq.Waiting(ctx, rdb); err == nil {
			if n == 0 {
				return "(none waiting in the Redis fallback)"
			}
			return fmt.Sprintf("(%d more waiting in the Redis fallback; the scheduler's drain_dlq moves them into this list every minute)", n)
		}
	}
	return "(the Redis fallback could not be read (REDIS_URL): " + strings.Join(strings.Fields(err.Error()), " ") + ")"
}

func runReconcile(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	chunk := fs.Int("chunk", postgres.ReconcileChunkDefault, "balances per snapshot")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *chunk < 1 {
		return fmt.Errorf("%w: --chunk must be above zero", config.ErrUsage)
	}
	db, err := openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	// Every = 0: start a pass now; the chunk bound is generous because an
	// operator runs this to the end.
	pass, err := db.ReconcileFull(ctx, 0, *chunk, 1<<30)
	for _, m := range pass.Found {
		fmt.Fprintln(out, "MISMATCH", m.String())
	}
	if err != nil {
		return err
	}
	// The scheduler may advance this pass too (it resumes the newest open
	// one): report and judge the pass's totals, not only what ran here.
	fmt.Fprintf(out, "pass %d: %d balances checked, %d mismatches\n", pass.ID, pass.PassChecked, pass.PassMismatches)
	if other := pass.PassMismatches - pass.Mismatches; other > 0 {
		fmt.Fprintf(out, "%d of the mismatches found by another run of this pass (settlectl prints only its own; the scheduler alerts on them all)\n", other)
	}
	if pass.PassMismatches > 0 {
		return errCheckFailed
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// checkOperatorReason bounds --operator and --reason as the admin API
// does, before anything is written: the columns take any length, so an
// over-long value would be stored where the API refuses it.
func checkOperatorReason(who, reason string) error {
	if n := utf8.RuneCountInString(who); n > payment.OperatorLengthMax {
		return fmt.Errorf("%w: --operator is %d characters; at most %d", config.ErrUsage, n, payment.OperatorLengthMax)
	}
	if n := utf8.RuneCountInString(reason); n > payment.ReasonLengthMax {
		return fmt.Errorf("%w: --reason is %d characters; at most %d", config.ErrUsage, n, payment.ReasonLengthMax)
	}
	switch {
	case !payment.NameFits(who, payment.OperatorLengthMax):
		return fmt.Errorf("%w: --operator must be valid UTF-8 without control characters", config.ErrUsage)
	case !payment.NoteFits(reason, payment.ReasonLengthMax):
		return fmt.Errorf("%w: --reason must be valid UTF-8 without control characters but line breaks and tabs", config.ErrUsage)
	}
	return nil
}

// optionalID reads the one positional id a subcommand may take (0 when
// there is none): a positive integer, else a usage error naming what it is.
func optionalID(rest []string, what string) (int64, error) {
	if len(rest) == 0 {
		return 0, nil
	}
	id, err := strconv.ParseInt(rest[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: %q is not a %s", config.ErrUsage, rest[0], what)
	}
	return id, nil
}
