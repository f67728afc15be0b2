// Command settlectl is the operator's CLI: migrations, users, deposit
// addresses, the DLQ, reconciliation, the invariant check, the load tool
// and the local development stack.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/settle/settle/pkg/config"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/service"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, out io.Writer) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, out io.Writer) error) {
	commands[name] = command{summary: summary, run: run}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: settlectl <command> [flags]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-14s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Settings come from the environment (DATABASE_URL, REDIS_URL, ...), as for the services.")
}

// errCheckFailed ends a command that ran fine but found a problem
// (a reconciliation mismatch, a broken invariant): exit code 1.
var errCheckFailed = errors.New("check failed")

func main() {
	if len(os.Args) < 2 {
		// No command is a usage error: its text goes where errors go.
		usage(os.Stderr)
		os.Exit(service.ExitSettings)
	}
	if isHelp(os.Args[1]) {
		usage(os.Stdout)
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok && devCommands[os.Args[1]] {
		fmt.Fprintf(os.Stderr, "settlectl: %q is a development command; this settlectl was built without them (go build -tags dev ./cmd/settlectl)\n", os.Args[1])
		os.Exit(service.ExitSettings)
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "settlectl: unknown command %q\n\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(service.ExitSettings)
	}
	ctx, stop := service.SignalContext()
	defer stop()
	if code := exitCode(os.Stderr, os.Args[1], cmd.run(ctx, os.Args[2:], os.Stdout)); code != 0 {
		stop()
		os.Exit(code)
	}
}

// exitCode says how command name ends after err, and prints err on one
// line to stderr: the driver's connect error lists every address tried
// on lines of its own, and a script reads one line.
func exitCode(stderr io.Writer, name string, err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // help: the command printed it
		return 0
	case errors.Is(err, errCheckFailed):
		return service.ExitFailure
	}
	fmt.Fprintf(stderr, "settlectl %s: %s\n", name, strings.Join(strings.Fields(err.Error()), " "))
	var flagErr *flagError
	if errors.As(err, &flagErr) {
		// After the one line a script reads: the flags the operator can give.
		fmt.Fprintln(stderr)
		fmt.Fprint(stderr, flagErr.usage)
	}
	if errors.Is(err, config.ErrUsage) {
		return service.ExitSettings
	}
	return service.ExitFailure
}

// flagError is a subcommand's flags or arguments refused (a usage
// error), carrying that subcommand's usage for stderr.
type flagError struct {
	err   error
	usage string
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

func newFlagError(fs *flag.FlagSet, positional []string, format string, args ...any) error {
	var usage strings.Builder
	printHelp(&usage, fs, positional)
	return &flagError{err: fmt.Errorf("%w: "+format, append([]any{config.ErrUsage}, args...)...), usage: usage.String()}
}

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "help" }

// groupHelp answers `settlectl dlq --help` (a command made of
// subcommands): its usage line on stdout, exit 0, nothing done.
func groupHelp(name string, args []string) error {
	if len(args) == 0 || !isHelp(args[0]) {
		return nil
	}
	fmt.Fprintf(os.Stdout, "usage: settlectl %s\n\nsettlectl %s <subcommand> --help lists a subcommand's flags.\n", commands[name].summary, name)
	return flag.ErrHelp
}

// openDB connects with DATABASE_URL; a missing or malformed setting is a
// usage error, which never repeats the value (it holds the password, and
// the driver masks it only as best it can).
func openDB(ctx context.Context) (*postgres.DB, error) {
	env := config.FromOS()
	url := env.Required("DATABASE_URL")
	service.CheckDatabaseURL(env, "DATABASE_URL", url)
	if err := env.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", config.ErrUsage, err)
	}
	// The services wait up to a minute for a PostgreSQL still starting;
	// an operator at a prompt wants the answer now.
	openCtx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	db, err := postgres.Open(openCtx, url, postgres.Options{ConnsMax: 4, ApplicationName: "settlectl"})
	if err != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("no connection to PostgreSQL (DATABASE_URL) within %s: %s", connectWait, postgres.ConnectCause(err))
	}
	return db, err
}

// connectWait bounds settlectl's wait for PostgreSQL (tries included).
const connectWait = 5 * time.Second

// parseFlags parses a subcommand's flags, before or after its positional
// arguments; extra positional args are refused unless positional names
// them, and so is a flag fs does not define (a sibling subcommand's
// --reason given to `dlq list` would otherwise read as taken). -h or
// --help prints the command's flags and ends it (exit 0).
func parseFlags(fs *flag.FlagSet, args []string, positional ...string) ([]string, error) {
	fs.SetOutput(io.Discard)
	ordered, dangling, unknown := reorderFlags(fs, args)
	if unknown != "" {
		return nil, newFlagError(fs, positional, "unknown flag %s for %s", unknown, fs.Name())
	}
	if dangling != "" {
		// Left to fs, it would take the "--" before the positional
		// arguments as its value: `dlq discard 7 --reason` discarding
		// with the reason "--".
		return nil, newFlagError(fs, positional, "flag needs an argument: %s", dangling)
	}
	if err := fs.Parse(ordered); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(os.Stdout, fs, positional)
			return nil, err
		}
		return nil, newFlagError(fs, positional, "%w", err)
	}
	rest := fs.Args()
	if len(rest) != len(positional) {
		return nil, newFlagError(fs, positional, "expected %s", strings.Join(append([]string{"flags"}, positional...), " "))
	}
	return rest, nil
}

func printHelp(w io.Writer, fs *flag.FlagSet, positional []string) {
	line := "usage: settlectl " + fs.Name()
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		line += " [flags]"
	}
	for _, p := range positional {
		line += " " + p
	}
	fmt.Fprintln(w, line)
	if n > 0 {
		fmt.Fprintln(w)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

// reorderFlags moves flags ahead of positional arguments ("create 7
// --initial ETH=1" parses like "--initial ETH=1 create 7"), so flags may
// come anywhere. A flag takes the next argument as its value unless it is
// a bool flag (fs says which) or carries "=value"; after "--" everything
// is positional. dangling names a last flag that wants a value and has
// none; unknown the first flag fs does not define (-h and --help aside).
func reorderFlags(fs *flag.FlagSet, args []string) (ordered []string, dangling, unknown string) {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil && name != "h" && name != "help" && unknown == "" {
			unknown, _, _ = strings.Cut(a, "=") // the flag, never its value
		}
		if hasValue {
			continue
		}
		if f == nil {
			continue // -h, --help, or refused as unknown
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		} else {
			dangling = a
		}
	}
	if len(positional) == 0 {
		return flags, dangling, unknown
	}
	return append(append(flags, "--"), positional...), dangling, unknown
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
