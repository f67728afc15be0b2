package postgres

import (
	"bufio"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync"

	"github.com/settle/settle/pkg/payment"
)

// The SQL lives in queries/*.sql, one statement per "-- name: x" block.
// A statement that writes payment_events.status must declare the edges it
// performs with "-- transition: from[,from] -> to"; the declaration is
// checked against payment.CanTransition when the package loads, and such a
// statement can only be run through transition (transition.go). The same
// holds for holds.status: "-- hold transition: from -> to" lines, checked
// against payment.HoldStatus.CanTransition. An INSERT into payment_events
// that names the status column declares the statuses it may insert with
// "-- insert status: s[,s]", each one the insert guard admits
// (insertableStatuses); an insert that leaves status out writes 'pending'.
//
// Statements that find rows by key and check their status write
// status = '...' COLLATE "C". It is the same equality, but the planner can
// no longer use the partial status indexes for it: their dead entries pile
// up between vacuums under load (every move between statuses leaves one),
// and a lookup that walked them read hundreds of heap pages where the
// primary key reads one per row.
//
// Amounts travel as decimal strings, so an array of them is declared
// $n::text[] and cast (::numeric[]) in the statement. Declared numeric[],
// pgx has no binary encoding for []string: every call planned one afresh,
// failed, built the error's text with fmt and only then sent the array as
// text, a few percent of the api's and the worker's CPU at a trickle.
//
//go:embed queries/*.sql
var queryFiles embed.FS

type query struct {
	name string
	text string
	// from and to are set for status-writing statements.
	from []payment.Status
	to   payment.Status
	// holdEdges counts the declared hold transitions.
	holdEdges int
	// inserts are the declared initial statuses of an insert.
	inserts []payment.Status
}

// insertableStatuses mirrors payment_events_insert_guard (migration 0017):
// an event is born 'pending', or 'enqueued' when the api hands its own
// commit to the queue (the pending -> enqueued edge taken in the insert;
// the trigger also wants a task id then).
var insertableStatuses = map[payment.Status]bool{payment.StatusPending: true, payment.StatusEnqueued: true}

var (
	queriesByName = mustParseQueries(queryFiles)
	queriesUsedMu sync.Mutex
	queriesUsed   = map[string]bool{}
)

// q returns the named statement; a missing name is a programming error
// caught the moment the package initialises.
func q(name string) query {
	found, ok := queriesByName[name]
	if !ok {
		panic(fmt.Sprintf("postgres: no query named %q in queries/*.sql", name))
	}
	queriesUsedMu.Lock()
	queriesUsed[name] = true
	queriesUsedMu.Unlock()
	return found
}

func mustParseQueries(files fs.FS) map[string]query {
	parsed, err := parseQueries(files)
	if err != nil {
		panic(err)
	}
	return parsed
}

func parseQueries(files fs.FS) (map[string]query, error) {
	names, err := fs.Glob(files, "queries/*.sql")
	if err != nil {
		return nil, err
	}
	out := map[string]query{}
	for _, file := range names {
		data, err := fs.ReadFile(files, file)
		if err != nil {
			return nil, err
		}
		var current *query
		var body strings.Builder
		flush := func() error {
			if current == nil {
				return nil
			}
			current.text = strings.TrimSpace(body.String())
			if current.text == "" {
				return fmt.Errorf("%s: query %q is empty", file, current.name)
			}
			if _, dup := out[current.name]; dup {
				return fmt.Errorf("%s: query %q defined twice", file, current.name)
			}
			if writesEventStatus(current.text) && current.to == "" {
				return fmt.Errorf("%s: query %q writes status without a -- transition: line", file, current.name)
			}
			if insertsEventStatus(current.text) && len(current.inserts) == 0 {
				return fmt.Errorf("%s: query %q inserts status without a -- insert status: line", file, current.name)
			}
			if writesStatusOf(updateHolds, current.text) && current.holdEdges == 0 {
				return fmt.Errorf("%s: query %q writes holds.status without a -- hold transition: line", file, current.name)
			}
			if numericArrayParam.MatchString(current.text) {
				return fmt.Errorf("%s: query %q declares a numeric[] parameter: declare it $n::text[] and cast it (::numeric[])", file, current.name)
			}
			out[current.name] = *current
			body.Reset()
			return nil
		}
		scanner := bufio.NewScanner(strings.NewReader(string(data)))
		for scanner.Scan() {
			line := scanner.Text()
			trimmed := strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(trimmed, "-- name:"):
				if err := flush(); err != nil {
					return nil, err
				}
				current = &query{name: strings.TrimSpace(strings.TrimPrefix(trimmed, "-- name:"))}
			case strings.HasPrefix(trimmed, "-- hold transition:"):
				if current == nil {
					return nil, fmt.Errorf("%s: hold transition line outside a query", file)
				}
				if err := parseHoldEdge(strings.TrimPrefix(trimmed, "-- hold transition:")); err != nil {
					return nil, fmt.Errorf("%s: query %q: %w", file, current.name, err)
				}
				current.holdEdges++
			case strings.HasPrefix(trimmed, "-- insert status:"):
				if current == nil {
					return nil, fmt.Errorf("%s: insert status line outside a query", file)
				}
				inserts, err := parseInsertStatuses(strings.TrimPrefix(trimmed, "-- insert status:"))
				if err != nil {
					return nil, fmt.Errorf("%s: query %q: %w", file, current.name, err)
				}
				current.inserts = inserts
			case strings.HasPrefix(trimmed, "-- transition:"):
				if current == nil {
					return nil, fmt.Errorf("%s: transition line outside a query", file)
				}
				from, to, err := parseEdge(strings.TrimPrefix(trimmed, "-- transition:"))
				if err != nil {
					return nil, fmt.Errorf("%s: query %q: %w", file, current.name, err)
				}
				current.from, current.to = from, to
			case current != nil:
				body.WriteString(line)
				body.WriteByte('\n')
			}
		}
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var (
	updateEvents  = regexp.MustCompile(`(?i)\bupdate\s+payment_events\b`)
	updateHolds   = regexp.MustCompile(`(?i)\bupdate\s+holds\b`)
	assignsStatus = regexp.MustCompile(`(?i)(^|[\s,])status\s*=`)
	whereClause   = regexp.MustCompile(`(?i)\bwhere\b`)
	// insertEvents captures an insert's column list.
	insertEvents = regexp.MustCompile(`(?i)\binsert\s+into\s+payment_events\s*\(([^)]*)\)`)
	namesStatus  = regexp.MustCompile(`(?i)\bstatus\b`)
	// numericArrayParam: a parameter declared numeric[] (see the top).
	numericArrayParam = regexp.MustCompile(`(?i)\$\d+\s*::\s*(numeric|decimal)\s*\[\]`)
)

// insertsEventStatus finds an INSERT into payment_events whose column list
// names status.
func insertsEventStatus(text string) bool {
	for _, m := range insertEvents.FindAllStringSubmatch(text, -1) {
		if namesStatus.MatchString(m[1]) {
			return true
		}
	}
	return false
}

func parseInsertStatuses(text string) ([]payment.Status, error) {
	var out []payment.Status
	for _, f := range strings.Split(text, ",") {
		s := payment.Status(strings.TrimSpace(f))
		if !insertableStatuses[s] {
			return nil, fmt.Errorf("an event cannot be inserted %q", s)
		}
		out = append(out, s)
	}
	return out, nil
}

// writesEventStatus finds an UPDATE of payment_events whose SET list (up
// to its WHERE) assigns status.
func writesEventStatus(text string) bool { return writesStatusOf(updateEvents, text) }

// writesStatusOf finds an UPDATE of the table update matches whose SET
// list assigns status.
func writesStatusOf(update *regexp.Regexp, text string) bool {
	for _, loc := range update.FindAllStringIndex(text, -1) {
		rest := text[loc[1]:]
		if w := whereClause.FindStringIndex(rest); w != nil {
			rest = rest[:w[0]]
		}
		if assignsStatus.MatchString(rest) {
			return true
		}
	}
	return false
}

func parseEdge(text string) ([]payment.Status, payment.Status, error) {
	left, right, ok := strings.Cut(text, "->")
	if !ok {
		return nil, "", fmt.Errorf("transition %q lacks ->", text)
	}
	to := payment.Status(strings.TrimSpace(right))
	if !to.Valid() {
		return nil, "", fmt.Errorf("unknown status %q", to)
	}
	var from []payment.Status
	for _, f := range strings.Split(left, ",") {
		s := payment.Status(strings.TrimSpace(f))
		if !payment.CanTransition(s, to) {
			return nil, "", fmt.Errorf("%s -> %s is not an allowed transition", s, to)
		}
		from = append(from, s)
	}
	return from, to, nil
}

func parseHoldEdge(text string) error {
	left, right, ok := strings.Cut(text, "->")
	if !ok {
		return fmt.Errorf("hold transition %q lacks ->", text)
	}
	from, to := payment.HoldStatus(strings.TrimSpace(left)), payment.HoldStatus(strings.TrimSpace(right))
	if !from.Valid() || !to.Valid() || !from.CanTransition(to) {
		return fmt.Errorf("hold %s -> %s is not an allowed transition", from, to)
	}
	return nil
}
